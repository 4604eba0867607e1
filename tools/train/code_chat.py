"""Chat samples about Python: templated coding tasks, dataclass sets, and question/answer pairs mined
from the Python sources the model trains on (functions with docstrings, module and class docstrings).
Deterministic for a given seed and file list."""
from __future__ import annotations

import ast
import hashlib
import textwrap

# ---- templated coding tasks: (questions, lead sentence, code, closing sentence); {f} = function name
TASKS = [
    (["Write a Python function that reverses a string.", "How do I reverse a string in Python?"],
     "You can reverse a string with slicing:",
     "def {f}(s: str) -> str:\n    return s[::-1]\n\n\nprint({f}(\"hello\"))  # olleh",
     "The slice `[::-1]` walks the string backwards with a step of -1.", ["reverse_string", "reverse"]),
    (["Write a Python function that computes the factorial of n.", "How do I compute a factorial in Python?"],
     "Here is an iterative version:",
     "def {f}(n: int) -> int:\n    if n < 0:\n        raise ValueError(\"n must be non-negative\")\n    result = 1\n"
     "    for i in range(2, n + 1):\n        result *= i\n    return result",
     "For real code, `math.factorial` does the same thing.", ["factorial", "fact"]),
    (["Write a Python function that returns the first n Fibonacci numbers.", "Generate Fibonacci numbers in Python."],
     "This builds the list one number at a time:",
     "def {f}(n: int) -> list[int]:\n    result = []\n    a, b = 0, 1\n    for _ in range(n):\n        result.append(a)\n"
     "        a, b = b, a + b\n    return result\n\n\nprint({f}(10))  # [0, 1, 1, 2, 3, 5, 8, 13, 21, 34]",
     "Each step keeps only the last two numbers, so it runs in linear time.", ["fibonacci", "fib"]),
    (["Write a Python function that checks whether a number is prime.", "How can I test if a number is prime in Python?"],
     "Trial division up to the square root is enough:",
     "def {f}(n: int) -> bool:\n    if n < 2:\n        return False\n    i = 2\n    while i * i <= n:\n"
     "        if n % i == 0:\n            return False\n        i += 1\n    return True",
     "It stops as soon as it finds a divisor.", ["is_prime", "prime"]),
    (["Write a Python function that returns the sum of a list of numbers.", "How do I add up a list in Python?"],
     "The built-in `sum` does it, but here is the loop written out:",
     "def {f}(numbers: list[float]) -> float:\n    total = 0\n    for x in numbers:\n        total += x\n    return total",
     "`sum(numbers)` gives the same result.", ["total", "sum_list"]),
    (["Write a Python function that computes the average of a list.", "How do I compute the mean of a list in Python?"],
     "Divide the sum by the length, and handle the empty list:",
     "def {f}(values: list[float]) -> float:\n    if not values:\n        raise ValueError(\"empty list\")\n"
     "    return sum(values) / len(values)",
     "The `statistics.mean` function also works.", ["average", "mean"]),
    (["Write a Python function that counts the words in a text.", "How do I count word frequencies in Python?"],
     "`collections.Counter` counts hashable items:",
     "from collections import Counter\n\n\ndef {f}(text: str) -> Counter:\n    return Counter(text.lower().split())\n\n\n"
     "print({f}(\"the cat and the hat\").most_common(2))",
     "`most_common(n)` returns the n most frequent words with their counts.", ["word_counts", "count_words"]),
    (["Write a Python function that checks if a string is a palindrome.", "How do I check for a palindrome in Python?"],
     "Normalize the string, then compare it with its reverse:",
     "def {f}(s: str) -> bool:\n    cleaned = \"\".join(c.lower() for c in s if c.isalnum())\n    return cleaned == cleaned[::-1]",
     "Spaces and punctuation are ignored, so \"A man, a plan, a canal: Panama\" is a palindrome.",
     ["is_palindrome", "palindrome"]),
    (["Write a Python function that removes duplicates from a list while keeping the order.",
      "How do I remove duplicates from a list in Python?"],
     "A dictionary keeps insertion order, so this works:",
     "def {f}(items: list) -> list:\n    return list(dict.fromkeys(items))",
     "`set(items)` also removes duplicates, but it does not keep the order.", ["dedupe", "unique"]),
    (["Write a Python function that flattens a nested list.", "How do I flatten a list of lists in Python?"],
     "A recursive generator handles any depth:",
     "def {f}(items):\n    for item in items:\n        if isinstance(item, list):\n            yield from {f}(item)\n"
     "        else:\n            yield item\n\n\nprint(list({f}([1, [2, [3, 4]], 5])))  # [1, 2, 3, 4, 5]",
     "`yield from` passes on every value of the inner generator.", ["flatten"]),
    (["Write a Python function that reads a file and returns its lines.", "How do I read a text file line by line in Python?"],
     "Use a `with` block so the file is closed:",
     "def {f}(path: str) -> list[str]:\n    with open(path, encoding=\"utf-8\") as f:\n        return [line.rstrip(\"\\n\") for line in f]",
     "Iterating over the file object reads one line at a time.", ["read_lines", "load_lines"]),
    (["Write a Python function that writes a list of strings to a file.", "How do I write lines to a file in Python?"],
     "Open the file in write mode and join the lines:",
     "def {f}(path: str, lines: list[str]) -> None:\n    with open(path, \"w\", encoding=\"utf-8\") as f:\n"
     "        f.write(\"\\n\".join(lines) + \"\\n\")",
     "Mode `\"a\"` appends instead of overwriting.", ["write_lines", "save_lines"]),
    (["Write a Python function that sorts a dictionary by its values.", "How do I sort a dict by value in Python?"],
     "`sorted` with a key function does it:",
     "def {f}(d: dict) -> dict:\n    return dict(sorted(d.items(), key=lambda kv: kv[1]))\n\n\n"
     "print({f}({{\"b\": 2, \"a\": 3, \"c\": 1}}))  # {{'c': 1, 'b': 2, 'a': 3}}",
     "Pass `reverse=True` to sort from largest to smallest.", ["sort_by_value"]),
    (["Write a Python function that converts Celsius to Fahrenheit.", "Convert Celsius to Fahrenheit in Python."],
     "The formula is F = C * 9 / 5 + 32:",
     "def {f}(celsius: float) -> float:\n    return celsius * 9 / 5 + 32\n\n\nprint({f}(100))  # 212.0", "",
     ["celsius_to_fahrenheit", "c_to_f"]),
    (["Write a Python function that computes the greatest common divisor of two numbers.",
      "How do I compute the GCD in Python?"],
     "Euclid's algorithm:",
     "def {f}(a: int, b: int) -> int:\n    while b:\n        a, b = b, a % b\n    return abs(a)",
     "The standard library has `math.gcd` as well.", ["gcd"]),
    (["Write a binary search in Python.", "Write a Python function that does binary search on a sorted list."],
     "This returns the index of the target, or -1:",
     "def {f}(items: list[int], target: int) -> int:\n    lo, hi = 0, len(items) - 1\n    while lo <= hi:\n"
     "        mid = (lo + hi) // 2\n        if items[mid] == target:\n            return mid\n"
     "        if items[mid] < target:\n            lo = mid + 1\n        else:\n            hi = mid - 1\n    return -1",
     "The `bisect` module offers the same search for sorted lists.", ["binary_search", "search"]),
    (["Write bubble sort in Python.", "Implement bubble sort in Python."],
     "Bubble sort swaps neighbours until the list is sorted:",
     "def {f}(items: list) -> list:\n    items = list(items)\n    n = len(items)\n    for i in range(n):\n"
     "        for j in range(n - 1 - i):\n            if items[j] > items[j + 1]:\n"
     "                items[j], items[j + 1] = items[j + 1], items[j]\n    return items",
     "It takes O(n^2) time; use `sorted` in real code.", ["bubble_sort"]),
    (["How do I use a list comprehension in Python?", "Write a list comprehension that squares the numbers 0 to 9."],
     "A list comprehension builds a list from an expression and a loop:",
     "squares = [x * x for x in range(10)]\nevens = [x for x in range(20) if x % 2 == 0]\nprint(squares)\nprint(evens)",
     "The optional `if` clause filters the items.", ["squares"]),
    (["How do I read and write JSON in Python?", "Write a Python function that loads a JSON file."],
     "The `json` module converts between JSON text and Python objects:",
     "import json\n\n\ndef {f}(path: str):\n    with open(path, encoding=\"utf-8\") as f:\n        return json.load(f)\n\n\n"
     "def save_json(path: str, data) -> None:\n    with open(path, \"w\", encoding=\"utf-8\") as f:\n"
     "        json.dump(data, f, indent=2)",
     "`json.loads` and `json.dumps` work on strings instead of files.", ["load_json", "read_json"]),
    (["How do I handle exceptions in Python?", "Show me try and except in Python."],
     "Put the code that can fail in a `try` block:",
     "def {f}(text: str) -> int | None:\n    try:\n        return int(text)\n    except ValueError:\n"
     "        print(f\"not a number: {{text!r}}\")\n        return None\n    finally:\n        print(\"done\")",
     "The `finally` block runs whether or not an exception was raised.", ["parse_int", "to_int"]),
    (["Write a Python script that parses command-line arguments.", "How do I use argparse in Python?"],
     "`argparse` builds the parser and the help text:",
     "import argparse\n\n\ndef {f}() -> None:\n    parser = argparse.ArgumentParser(description=\"Greet someone.\")\n"
     "    parser.add_argument(\"name\")\n    parser.add_argument(\"--count\", type=int, default=1)\n"
     "    args = parser.parse_args()\n    for _ in range(args.count):\n        print(f\"Hello, {{args.name}}!\")\n\n\n"
     "if __name__ == \"__main__\":\n    {f}()",
     "Run it as `python greet.py Ada --count 2`.", ["main"]),
    (["Write a Python decorator that measures how long a function takes.", "How do I time a function in Python?"],
     "A decorator wraps the function and measures each call:",
     "import functools\nimport time\n\n\ndef {f}(func):\n    @functools.wraps(func)\n    def wrapper(*args, **kwargs):\n"
     "        start = time.perf_counter()\n        result = func(*args, **kwargs)\n"
     "        elapsed = time.perf_counter() - start\n        print(f\"{{func.__name__}} took {{elapsed:.3f}} s\")\n"
     "        return result\n    return wrapper",
     "`functools.wraps` keeps the wrapped function's name and docstring.", ["timed", "timer"]),
    (["Write a Python generator that yields the squares of numbers.", "How do generators work in Python?"],
     "A function with `yield` returns a generator:",
     "def {f}(n: int):\n    for i in range(n):\n        yield i * i\n\n\nfor value in {f}(5):\n    print(value)",
     "Values are computed one at a time, only when they are needed.", ["squares", "gen_squares"]),
    (["Write a context manager in Python.", "How do I write my own context manager in Python?"],
     "`contextlib.contextmanager` turns a generator into a context manager:",
     "import contextlib\nimport os\n\n\n@contextlib.contextmanager\ndef {f}(path: str):\n    old = os.getcwd()\n"
     "    os.chdir(path)\n    try:\n        yield\n    finally:\n        os.chdir(old)",
     "The code after `yield` runs when the `with` block ends, even after an exception.", ["working_directory", "cd"]),
    (["Write a unit test in Python.", "How do I test a function with unittest?"],
     "Subclass `unittest.TestCase` and write methods that start with `test`:",
     "import unittest\n\n\ndef add(a, b):\n    return a + b\n\n\nclass {F}(unittest.TestCase):\n    def test_add(self):\n"
     "        self.assertEqual(add(2, 3), 5)\n\n    def test_negative(self):\n        self.assertEqual(add(-1, 1), 0)\n\n\n"
     "if __name__ == \"__main__\":\n    unittest.main()",
     "Run it with `python -m unittest`.", ["TestAdd"]),
    (["Write a Python function that finds all email addresses in a text.", "How do I use regular expressions in Python?"],
     "The `re` module finds every match of a pattern:",
     "import re\n\nEMAIL = re.compile(r\"[\\w.+-]+@[\\w-]+\\.[\\w.]+\")\n\n\ndef {f}(text: str) -> list[str]:\n"
     "    return EMAIL.findall(text)",
     "`findall` returns the matched strings in order.", ["find_emails"]),
    (["Write a Python loop that iterates over a list with indexes.", "How do I use enumerate in Python?"],
     "`enumerate` gives the index and the item:",
     "fruits = [\"apple\", \"banana\", \"cherry\"]\nfor i, fruit in enumerate(fruits, start=1):\n    print(f\"{{i}}. {{fruit}}\")",
     "`start=1` makes the numbering begin at 1.", ["loop"]),
    (["How do I iterate over two lists at once in Python?", "How do I use zip in Python?"],
     "`zip` pairs up items from several iterables:",
     "names = [\"Ada\", \"Alan\", \"Grace\"]\nyears = [1815, 1912, 1906]\nfor name, year in zip(names, years):\n"
     "    print(f\"{{name}} was born in {{year}}\")",
     "It stops at the end of the shortest list.", ["pairs"]),
    (["Write a Python class for a bank account.", "Write a simple Python class with methods."],
     "Here is a small class with a constructor and two methods:",
     "class {F}:\n    \"\"\"A bank account with a balance.\"\"\"\n\n    def __init__(self, owner: str, balance: float = 0.0):\n"
     "        self.owner = owner\n        self.balance = balance\n\n    def deposit(self, amount: float) -> None:\n"
     "        if amount <= 0:\n            raise ValueError(\"amount must be positive\")\n        self.balance += amount\n\n"
     "    def withdraw(self, amount: float) -> None:\n        if amount > self.balance:\n"
     "            raise ValueError(\"insufficient funds\")\n        self.balance -= amount",
     "Each method takes `self`, the instance it is called on.", ["BankAccount", "Account"]),
    (["Write a Python function that counts the vowels in a string.", "Count vowels in a string with Python."],
     "Check each character against a set of vowels:",
     "def {f}(s: str) -> int:\n    vowels = set(\"aeiouAEIOU\")\n    return sum(1 for c in s if c in vowels)", "",
     ["count_vowels"]),
    (["Write a Python function that merges two dictionaries.", "How do I merge dicts in Python?"],
     "The `|` operator (Python 3.9+) merges two dictionaries:",
     "def {f}(a: dict, b: dict) -> dict:\n    return a | b\n\n\nprint({f}({{\"x\": 1}}, {{\"y\": 2}}))  # {{'x': 1, 'y': 2}}",
     "Keys in `b` win when both have the same key.", ["merge"]),
    (["How do I get the current date and time in Python?", "Format a date in Python."],
     "Use the `datetime` module:",
     "from datetime import datetime\n\nnow = datetime.now()\nprint(now.isoformat())\nprint(now.strftime(\"%Y-%m-%d %H:%M\"))",
     "`strftime` formats a date with codes like `%Y` for the year.", ["now"]),
    (["Write a Python function that finds the largest number in a list.", "Find the maximum of a list in Python."],
     "Keep the largest value seen so far:",
     "def {f}(numbers: list[float]) -> float:\n    if not numbers:\n        raise ValueError(\"empty list\")\n"
     "    best = numbers[0]\n    for x in numbers[1:]:\n        if x > best:\n            best = x\n    return best",
     "The built-in `max` does the same.", ["largest", "find_max"]),
    (["Write a Python function that fetches a web page.", "How do I download a URL in Python?"],
     "The standard library's `urllib.request` can do it:",
     "from urllib.request import urlopen\n\n\ndef {f}(url: str) -> str:\n    with urlopen(url, timeout=10) as response:\n"
     "        return response.read().decode(\"utf-8\")",
     "Third-party libraries such as `requests` offer a friendlier API.", ["fetch"]),
    (["Write a Python function that splits a list into chunks.", "How do I split a list into chunks of size n?"],
     "Slice the list in steps of n:",
     "def {f}(items: list, n: int) -> list[list]:\n    return [items[i:i + n] for i in range(0, len(items), n)]\n\n\n"
     "print({f}([1, 2, 3, 4, 5], 2))  # [[1, 2], [3, 4], [5]]", "", ["chunks", "chunked"]),
]

# ---- dataclass sets
DOMAINS = {
    "an online bookshop": ["Book", "Author", "Publisher", "Customer", "Address", "Order", "OrderItem", "Review",
                           "Cart", "Payment", "Shipment", "Coupon", "Category", "Wishlist", "Inventory"],
    "a library": ["Book", "Member", "Loan", "Reservation", "Branch", "Librarian", "Fine", "Author", "Shelf"],
    "a school": ["Student", "Teacher", "Course", "Classroom", "Enrollment", "Grade", "Assignment", "Schedule"],
    "a hospital": ["Patient", "Doctor", "Nurse", "Appointment", "Prescription", "Ward", "Bill", "Address"],
    "an airline": ["Flight", "Airport", "Passenger", "Booking", "Seat", "Aircraft", "CrewMember", "Payment"],
    "a restaurant": ["MenuItem", "Order", "Table", "Reservation", "Customer", "Waiter", "Bill", "Ingredient"],
    "a bank": ["Customer", "Account", "Transaction", "Card", "Loan", "Branch", "Address", "Statement"],
    "a blog": ["Post", "Author", "Comment", "Tag", "Category", "Subscriber", "Draft", "Image"],
    "a warehouse": ["Product", "Supplier", "Shipment", "Inventory", "Location", "Order", "Employee", "Pallet"],
    "a music app": ["Song", "Artist", "Album", "Playlist", "User", "Subscription", "Review", "Genre"],
}
FIELDS = {
    "Book": [("title", "str"), ("author", "str"), ("isbn", "str"), ("price", "float"), ("pages", "int"),
             ("published", "date"), ("in_stock", "bool")],
    "Author": [("name", "str"), ("email", "str"), ("bio", "str"), ("born", "Optional[date]")],
    "Publisher": [("name", "str"), ("country", "str"), ("website", "str")],
    "Customer": [("name", "str"), ("email", "str"), ("phone", "str"), ("created_at", "datetime")],
    "Address": [("street", "str"), ("city", "str"), ("postal_code", "str"), ("country", "str")],
    "Order": [("customer_id", "int"), ("items", "list[int]"), ("total", "float"), ("status", "str"),
              ("created_at", "datetime")],
    "OrderItem": [("order_id", "int"), ("product_id", "int"), ("quantity", "int"), ("unit_price", "float")],
    "Review": [("user_id", "int"), ("rating", "int"), ("text", "str"), ("created_at", "datetime")],
    "Cart": [("customer_id", "int"), ("items", "list[int]"), ("updated_at", "datetime")],
    "Payment": [("order_id", "int"), ("amount", "float"), ("method", "str"), ("paid_at", "datetime")],
    "Shipment": [("order_id", "int"), ("carrier", "str"), ("tracking_number", "str"), ("shipped_at", "Optional[datetime]")],
    "Coupon": [("code", "str"), ("discount", "float"), ("expires", "date")],
    "Category": [("name", "str"), ("parent_id", "Optional[int]"), ("description", "str")],
    "Wishlist": [("customer_id", "int"), ("items", "list[int]")],
    "Inventory": [("product_id", "int"), ("quantity", "int"), ("warehouse", "str")],
    "Member": [("name", "str"), ("email", "str"), ("joined", "date"), ("active", "bool")],
    "Loan": [("member_id", "int"), ("item_id", "int"), ("due", "date"), ("returned", "bool")],
    "Reservation": [("name", "str"), ("starts_at", "datetime"), ("party_size", "int"), ("notes", "str")],
    "Branch": [("name", "str"), ("address", "str"), ("phone", "str")],
    "Librarian": [("name", "str"), ("branch_id", "int"), ("email", "str")],
    "Fine": [("member_id", "int"), ("amount", "float"), ("paid", "bool")],
    "Shelf": [("code", "str"), ("floor", "int"), ("capacity", "int")],
    "Student": [("name", "str"), ("student_id", "str"), ("year", "int"), ("email", "str")],
    "Teacher": [("name", "str"), ("subject", "str"), ("email", "str")],
    "Course": [("code", "str"), ("title", "str"), ("credits", "int"), ("teacher_id", "int")],
    "Classroom": [("room", "str"), ("capacity", "int"), ("has_projector", "bool")],
    "Enrollment": [("student_id", "int"), ("course_id", "int"), ("enrolled_on", "date")],
    "Grade": [("student_id", "int"), ("course_id", "int"), ("score", "float"), ("letter", "str")],
    "Assignment": [("course_id", "int"), ("title", "str"), ("due", "datetime"), ("max_points", "int")],
    "Schedule": [("course_id", "int"), ("weekday", "str"), ("start", "str"), ("end", "str")],
    "Patient": [("name", "str"), ("born", "date"), ("phone", "str"), ("allergies", "list[str]")],
    "Doctor": [("name", "str"), ("specialty", "str"), ("license_number", "str")],
    "Nurse": [("name", "str"), ("ward_id", "int"), ("shift", "str")],
    "Appointment": [("patient_id", "int"), ("doctor_id", "int"), ("starts_at", "datetime"), ("reason", "str")],
    "Prescription": [("patient_id", "int"), ("drug", "str"), ("dose_mg", "float"), ("days", "int")],
    "Ward": [("name", "str"), ("floor", "int"), ("beds", "int")],
    "Bill": [("amount", "float"), ("issued", "date"), ("paid", "bool")],
    "Flight": [("number", "str"), ("origin", "str"), ("destination", "str"), ("departs_at", "datetime")],
    "Airport": [("code", "str"), ("name", "str"), ("city", "str"), ("country", "str")],
    "Passenger": [("name", "str"), ("passport", "str"), ("email", "str")],
    "Booking": [("passenger_id", "int"), ("flight_id", "int"), ("seat", "str"), ("price", "float")],
    "Seat": [("row", "int"), ("letter", "str"), ("cabin", "str")],
    "Aircraft": [("model", "str"), ("registration", "str"), ("seats", "int")],
    "CrewMember": [("name", "str"), ("role", "str"), ("base", "str")],
    "MenuItem": [("name", "str"), ("price", "float"), ("vegetarian", "bool"), ("calories", "int")],
    "Table": [("number", "int"), ("seats", "int"), ("outdoor", "bool")],
    "Waiter": [("name", "str"), ("tables", "list[int]")],
    "Ingredient": [("name", "str"), ("unit", "str"), ("stock", "float")],
    "Account": [("owner_id", "int"), ("iban", "str"), ("balance", "float"), ("currency", "str")],
    "Transaction": [("account_id", "int"), ("amount", "float"), ("kind", "str"), ("timestamp", "datetime")],
    "Card": [("account_id", "int"), ("number", "str"), ("expires", "date"), ("blocked", "bool")],
    "Statement": [("account_id", "int"), ("month", "str"), ("closing_balance", "float")],
    "Post": [("title", "str"), ("body", "str"), ("author_id", "int"), ("published_at", "Optional[datetime]")],
    "Comment": [("post_id", "int"), ("author", "str"), ("text", "str"), ("created_at", "datetime")],
    "Tag": [("name", "str"), ("slug", "str")],
    "Subscriber": [("email", "str"), ("confirmed", "bool"), ("joined", "date")],
    "Draft": [("title", "str"), ("body", "str"), ("updated_at", "datetime")],
    "Image": [("url", "str"), ("width", "int"), ("height", "int"), ("alt", "str")],
    "Product": [("sku", "str"), ("name", "str"), ("price", "float"), ("weight_kg", "float")],
    "Supplier": [("name", "str"), ("contact", "str"), ("country", "str")],
    "Location": [("aisle", "str"), ("shelf", "int"), ("bin", "str")],
    "Employee": [("name", "str"), ("role", "str"), ("hired", "date"), ("salary", "float")],
    "Pallet": [("code", "str"), ("items", "list[str]"), ("weight_kg", "float")],
    "Song": [("title", "str"), ("artist_id", "int"), ("duration_s", "int"), ("explicit", "bool")],
    "Artist": [("name", "str"), ("country", "str"), ("genres", "list[str]")],
    "Album": [("title", "str"), ("artist_id", "int"), ("released", "date"), ("tracks", "list[int]")],
    "Playlist": [("name", "str"), ("owner_id", "int"), ("songs", "list[int]"), ("public", "bool")],
    "User": [("username", "str"), ("email", "str"), ("created_at", "datetime")],
    "Subscription": [("user_id", "int"), ("plan", "str"), ("renews", "date"), ("price", "float")],
    "Genre": [("name", "str"), ("description", "str")],
}


def _words(name: str) -> str:
    out = ""
    for i, c in enumerate(name):
        out += (" " + c.lower()) if c.isupper() and i else c.lower()
    return out


def dataclass_sample(rng):
    domain = rng.choice(sorted(DOMAINS))
    ents = DOMAINS[domain]
    n = rng.randint(2, min(8, len(ents)))
    chosen = ents[:n] if rng.random() < 0.6 else rng.sample(ents, n)
    shown = ", ".join(chosen[:min(4, n)]) + (", ..." if n > 4 else "")
    q = rng.choice([
        f"Write {n} Python dataclasses for {domain} ({shown}), each with typed fields and a short docstring.",
        f"Write Python dataclasses for {domain}: {', '.join(chosen)}.",
        f"Define dataclasses for {domain} with typed fields.",
    ])
    used = set()
    classes = []
    for e in chosen:
        fields = [("id", "int")] + FIELDS[e]
        used.update(t for _, t in fields)
        w = _words(e)
        body = [f"@dataclass\nclass {e}:", f'    """{"An" if w[0] in "aeiou" else "A"} {w} in {domain}."""']
        body += [f"    {fn}: {ft}" for fn, ft in fields]
        if rng.random() < 0.3:
            body.append("    tags: list[str] = field(default_factory=list)")
            used.add("field")
        classes.append("\n".join(body))
    imports = ["from dataclasses import dataclass" + (", field" if "field" in used else "")]
    types = " ".join(used)
    dt = [n for n in ("date", "datetime") if any(t == n or f"[{n}]" in t for t in used)]
    if dt:
        imports.append("from datetime import " + ", ".join(dt))
    if "Optional" in types:
        imports.append("from typing import Optional")
    code = "\n".join(imports) + "\n\n\n" + "\n\n\n".join(classes)
    lead = rng.choice([f"Here are {n} dataclasses for {domain}:", f"Here is a set of dataclasses for {domain}:"])
    tail = rng.choice(["Each class gets `__init__`, `__repr__` and `__eq__` from `@dataclass`.",
                       "Add `frozen=True` to `@dataclass` if the objects should be immutable.", ""])
    return q, f"{lead}\n\n```python\n{code}\n```" + (f"\n\n{tail}" if tail else "")


def task_sample(rng):
    qs, lead, code, tail, names = rng.choice(TASKS)
    name = rng.choice(names)
    code = code.replace("{f}", name).replace("{F}", name).replace("{{", "{").replace("}}", "}")
    ans = f"{lead}\n\n```python\n{code}\n```" + (f"\n\n{tail}" if tail else "")
    return rng.choice(qs), ans


# ---- mined from source files
def _summary(doc: str) -> str:
    para = doc.strip().split("\n\n")[0]
    s = " ".join(line.strip() for line in para.splitlines()).strip()
    return s


def _prose(doc: str, max_chars: int = 1200) -> str:
    paras = [p.strip() for p in textwrap.dedent(doc).strip().split("\n\n") if p.strip()]
    out = ""
    for p in paras:
        if ">>>" in p or len(out) + len(p) > max_chars:
            break
        out += ("\n\n" if out else "") + " ".join(line.strip() for line in p.splitlines())
    return out


def mine_file(name: str, text: str, rng):
    """(question, answer) pairs from one Python source file."""
    if not name.endswith(".py"):
        return []
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError):
        return []
    if "/test" in "/" + name or "/tests/" in name:
        return []
    lines = text.splitlines(keepends=True)

    def source(node):
        return textwrap.dedent("".join(lines[node.lineno - 1:node.end_lineno])).rstrip()

    mod = name[:-3].replace("/", ".").removeprefix("pkgs.").removesuffix(".__init__")
    out = []
    mdoc = ast.get_docstring(tree)
    if mdoc and len(_summary(mdoc)) > 30:
        p = _prose(mdoc)
        if p:
            q = rng.choice([f"What is the `{mod}` module for?", f"Explain what the Python module `{mod}` does.",
                            f"Describe the `{mod}` module."])
            out.append((q, p))
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
            doc = ast.get_docstring(node)
            src = source(node) if node.end_lineno - node.lineno < 60 else None
            if not doc or not src or not (120 <= len(src) <= 1500):
                continue
            s = _summary(doc)
            if not (15 <= len(s) <= 300) or "\t" in src:
                continue
            args = ast.unparse(node.args)
            if rng.random() < 0.7:
                s2 = s[0].lower() + s[1:] if s[:2].isalpha() and not s[:2].isupper() else s
                q = rng.choice([f"Write a Python function `{node.name}({args})`. Its docstring: {s}",
                                f"Implement `{node.name}({args})` in Python: {s2}",
                                f"Write a Python function named {node.name} that does this: {s2}"])
                out.append((q, f"Here is one way to write `{node.name}`:\n\n```python\n{src}\n```"))
            else:
                q = rng.choice([f"What does `{mod}.{node.name}` do?", f"Explain the function `{node.name}` in `{mod}`."])
                out.append((q, f"`{node.name}({args})`: {_prose(doc, 900)}"))
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            doc = ast.get_docstring(node)
            if doc and len(_summary(doc)) > 30:
                p = _prose(doc, 900)
                if p:
                    q = rng.choice([f"Explain the `{node.name}` class in `{mod}`.", f"What is `{mod}.{node.name}`?"])
                    out.append((q, p))
    return out


def mine(files, seed: int, max_samples: int):
    """Mined (question, answer) pairs from (name, text) files, at most max_samples, deterministic."""
    pairs = []
    for name, text in files:
        h = int.from_bytes(hashlib.sha256(f"{seed}:mine:{name}".encode()).digest()[:8], "little")
        import random
        pairs.extend(mine_file(name, text, random.Random(h)))
    rng = __import__("random").Random(seed + 5)
    rng.shuffle(pairs)
    return pairs[:max_samples]
