"""Training text and tokenizer for the built-in model. Everything comes from the machine it runs on
(no downloads): the Python standard library's sources, installed packages' sources and docs, plus
generated counting / listing / chat-format text. Deterministic for a given seed and file set.

Tokenizer: byte-level BPE trained with HF `tokenizers`, DeepSeek-V4's pre-tokenizer (spec 10.1:
three isolated Splits then ByteLevel without prefix space / regex), ids 0/1/2 = BOS/EOS/pad as in
the real file, then the learned vocabulary, then DeepSeek-V4's protocol special tokens (their ids
differ from the real 128k vocabulary; the C++ side looks them up by content).
"""
from __future__ import annotations

import hashlib
import os
import random
import site
import sysconfig

import code_chat as CC

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
PAD = "<｜▁pad▁｜>"
USER = "<｜User｜>"
ASSISTANT = "<｜Assistant｜>"
THINK = "<think>"
THINK_END = "</think>"
DSML = "｜DSML｜"
NOISE = "<｜place▁holder▁no▁799｜>"   # DSpark noise token (id 128799 in the real vocabulary)
PROTOCOL_TOKENS = [
    USER, ASSISTANT, THINK, THINK_END, DSML, "<｜latest_reminder｜>",
    "<｜action｜>", "<｜query｜>", "<｜authority｜>", "<｜domain｜>", "<｜title｜>", "<｜read_url｜>",
    "<｜fim▁hole｜>", "<｜fim▁begin｜>", "<｜fim▁end｜>", "<|EOT|>",
    "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>",
    "<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>", "<｜tool▁output▁begin｜>",
    "<｜tool▁output▁end｜>", "<｜tool▁sep｜>", NOISE,
]
# DeepSeek-V4 pre-tokenizer splits (spec 10.1), all behavior Isolated.
SPLIT_DIGITS = r"\p{N}{1,3}"
SPLIT_CJK = "[一-龥\u3040-ゟ゠-ヿ]+"
SPLIT_MAIN = (r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+|"""
              r""" ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")

TEXT_EXTS = (".py", ".rst", ".md", ".txt", ".pyi", ".toml", ".cfg", ".json")


def _is_val(name: str, seed: int, frac: float) -> bool:
    h = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(h[:4], "little") / 2**32 < frac


def collect_files(max_bytes: int, max_file_bytes: int = 300_000):
    """(name, text) of stdlib + site-packages text files, stdlib first, deterministic order."""
    roots = []
    std = sysconfig.get_paths()["stdlib"]
    roots.append(("stdlib", std))
    pkg_roots = set()
    for p in list(site.getsitepackages()) + [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]:
        if p and os.path.isdir(p):
            pkg_roots.add(os.path.realpath(p))
    for p in sorted(pkg_roots):
        roots.append(("pkgs", p))
    seen, docs, total = set(), [], 0
    for kind, root in roots:
        files = []
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            if kind == "stdlib" and ("site-packages" in dirpath or "dist-packages" in dirpath):
                continue
            for fn in sorted(filenames):
                if fn.endswith(TEXT_EXTS):
                    files.append(os.path.join(dirpath, fn))
        # packages: spread the byte budget over many packages (hash order), stdlib: all of it
        if kind == "pkgs":
            files.sort(key=lambda f: hashlib.sha256(f.encode()).digest())
        for path in files:
            rp = os.path.realpath(path)
            if rp in seen:
                continue
            seen.add(rp)
            try:
                size = os.path.getsize(rp)
                if size == 0 or size > max_file_bytes:
                    continue
                with open(rp, "rb") as f:
                    raw = f.read()
                text = raw.decode("utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            if "\x00" in text:
                continue
            docs.append((os.path.relpath(rp, root) if kind == "stdlib" else "pkgs/" + os.path.relpath(rp, root), text))
            total += len(raw)
            if total >= max_bytes:
                return docs
    return docs


NUM_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
             "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen", "twenty"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December"]
THINGS = ["apple", "banana", "cherry", "grape", "lemon", "mango", "orange", "peach", "pear", "plum", "kiwi",
          "melon", "carrot", "potato", "tomato", "onion", "bread", "cheese", "milk", "rice"]
COLORS = ["red", "orange", "yellow", "green", "blue", "indigo", "violet", "black", "white", "gray"]


def _count(rng, a=None, n=None, step=None):
    a = a if a is not None else rng.choice([0, 1, 1, 1, rng.randint(1, 1000)])
    n = n if n is not None else rng.randint(5, 120)
    step = step if step is not None else rng.choice([1, 1, 1, 1, 2, 5, 10, 3])
    seq = [str(a + i * step) for i in range(n)]
    sep = rng.choice([", ", ", ", "\n", " ", "; "])
    return seq, sep


def synthetic_docs(seed: int, n_docs: int):
    """Counting, listing and chat-format documents (full text, BOS/EOS included for chat)."""
    rng = random.Random(seed)
    docs = []
    for i in range(n_docs):
        kind = rng.random()
        if kind < 0.30:
            seq, sep = _count(rng)
            docs.append(sep.join(seq))
        elif kind < 0.40:
            k = rng.randint(0, 10)
            m = rng.randint(k + 3, 20)
            docs.append(", ".join(NUM_WORDS[k:m + 1]))
        elif kind < 0.48:
            lst = rng.choice([DAYS, MONTHS, COLORS, [chr(c) for c in range(97, 123)],
                              [chr(c) for c in range(65, 91)]])
            reps = rng.randint(1, 3)
            docs.append(rng.choice([", ", "\n", " "]).join(lst * reps))
        elif kind < 0.55:
            items = rng.sample(THINGS, rng.randint(3, 12))
            docs.append("\n".join(f"{j + 1}. {it}" for j, it in enumerate(items)))
        elif kind < 0.60:
            a = rng.randint(1, 12)
            docs.append("\n".join(f"{a} x {b} = {a * b}" for b in range(1, 13)))
        else:
            docs.append(chat_sample(rng))
    return docs


def chat(rng, user: str, answer: str) -> str:
    """One conversation in the DeepSeek-V4 prompt format (non-thinking mode)."""
    system = rng.choice(["", "", "You are a helpful assistant.", "You are Tandem, a small built-in model."])
    return f"{BOS}{system}{USER}{user}{ASSISTANT}{THINK_END}{answer}{EOS}"


def chat_sample(rng) -> str:
    r = rng.random()
    if r < 0.30:
        a = rng.choice([1, 1, 1, 0, rng.randint(1, 500)])
        n = rng.randint(5, 100)
        b = a + n - 1
        user = rng.choice([f"Count from {a} to {b}.", f"Please count from {a} to {b}.",
                           f"List the numbers from {a} to {b}.", f"count {a} to {b}"])
        answer = ", ".join(str(x) for x in range(a, b + 1))
    elif r < 0.35:
        user = rng.choice(["List the days of the week.", "What are the days of the week?"])
        answer = ", ".join(DAYS)
    elif r < 0.39:
        user = rng.choice(["List the months of the year.", "Name the twelve months."])
        answer = ", ".join(MONTHS)
    elif r < 0.42:
        user = rng.choice(["Write the alphabet.", "Recite the alphabet."])
        answer = " ".join(chr(c) for c in range(65, 91))
    elif r < 0.50:
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        user = rng.choice([f"What is {a} plus {b}?", f"What is {a} + {b}?", f"Add {a} and {b}."])
        answer = f"{a} + {b} = {a + b}."
    elif r < 0.55:
        user = rng.choice(["Say hello.", "Hello!", "Hi", "Who are you?", "What can you do?"])
        answer = rng.choice(["Hello! How can I help you today?", "Hi! I am Tandem, a small built-in model.",
                             "I am a small model built into Tandem. I can count, list things and write short "
                             "Python code."])
    elif r < 0.58:
        k = rng.randint(2, 10)
        user = f"Write a Python loop that prints the numbers 0 to {k - 1}."
        answer = f"```python\nfor i in range({k}):\n    print(i)\n```"
    elif r < 0.82:
        user, answer = CC.task_sample(rng)
    else:
        user, answer = CC.dataclass_sample(rng)
    return chat(rng, user, answer)


def train_tokenizer(texts, vocab_size: int, out_path: str):
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers, Regex, AddedToken
    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False, fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_DIGITS), behavior="isolated", invert=False),
        pre_tokenizers.Split(Regex(SPLIT_CJK), behavior="isolated", invert=False),
        pre_tokenizers.Split(Regex(SPLIT_MAIN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    n_extra = len(PROTOCOL_TOKENS)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - n_extra, min_frequency=2, show_progress=False,
        special_tokens=[AddedToken(BOS, special=True, normalized=False),
                        AddedToken(EOS, special=True, normalized=False),
                        AddedToken(PAD, special=True, normalized=False)],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    base = tok.get_vocab_size(with_added_tokens=True)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in PROTOCOL_TOKENS])
    assert tok.token_to_id(BOS) == 0 and tok.token_to_id(EOS) == 1 and tok.token_to_id(PAD) == 2
    tok.save(out_path)
    return tok, base


def build(seed: int, work: str, max_bytes: int, synth_docs: int, vocab_size: int, tok_train_bytes: int,
          val_frac: float = 0.02, max_mined: int = 40_000, log=print):
    """Collect text, train the tokenizer, tokenize. Returns dict with token lists and the tokenizer."""
    import time
    t0 = time.time()
    files = collect_files(max_bytes)
    nat_bytes = sum(len(t) for _, t in files)
    log(f"data: {len(files)} files, {nat_bytes / 1e6:.1f} MB chars, {time.time() - t0:.1f}s")
    synth = synthetic_docs(seed, synth_docs)
    rng = random.Random(seed)
    # tokenizer corpus: a deterministic sample of files + all synthetic docs
    sample = [t for _, t in files]
    rng.shuffle(sample)
    tok_texts, acc = [], 0
    for t in sample:
        tok_texts.append(t)
        acc += len(t)
        if acc >= tok_train_bytes:
            break
    tok_texts += synth
    tok_path = os.path.join(work, "tokenizer.json")
    tok, base = train_tokenizer(tok_texts, vocab_size, tok_path)
    log(f"tokenizer: base {base}, total {tok.get_vocab_size()} ({time.time() - t0:.1f}s)")
    train_docs, val_docs = [], []
    for name, text in files:
        (val_docs if _is_val(name, seed, val_frac) else train_docs).append(text)
    # chat questions about the training files' own Python code and docs (held-out files -> val_chat)
    mrng = random.Random(seed + 3)
    train_names = [(n, t) for n, t in files if not _is_val(n, seed, val_frac)]
    val_names = [(n, t) for n, t in files if _is_val(n, seed, val_frac)]
    mined = [chat(mrng, q, a) for q, a in CC.mine(train_names, seed, max_mined)]
    val_chat = [chat(mrng, q, a) for q, a in CC.mine(val_names, seed, max_mined)]
    log(f"mined chat: {len(mined)} train, {len(val_chat)} held-out ({time.time() - t0:.1f}s)")
    synth = synth + mined
    n_val_synth = max(1, (len(synth) - len(mined)) // 50)
    val_synth, train_synth = synth[:n_val_synth], synth[n_val_synth:]
    rng.shuffle(train_docs)

    def enc_plain(docs):
        ids = []
        for e in tok.encode_batch(docs, add_special_tokens=False):
            ids.append([0] + e.ids + [1])
        return ids

    def enc_synth(docs):
        out = []
        for d, e in zip(docs, tok.encode_batch(docs, add_special_tokens=False)):
            out.append(e.ids if d.startswith(BOS) else [0] + e.ids + [1])
        return out

    tr = enc_plain(train_docs) + enc_synth(train_synth)
    rng.shuffle(tr)
    va = enc_plain(val_docs)
    vs = enc_synth(val_synth)
    vc = enc_synth(val_chat)
    def flat(xs):
        import array
        import itertools
        return array.array("i", itertools.chain.from_iterable(xs))
    res = {"train": flat(tr), "val": flat(va), "val_synth": flat(vs), "val_chat": flat(vc), "tokenizer": tok, "tokenizer_path": tok_path,
           "files": len(files), "nat_bytes": nat_bytes, "vocab_base": base}
    log(f"tokens: train {len(res['train'])}, val {len(res['val'])}, val_synth {len(res['val_synth'])}, "
        f"val_chat {len(res['val_chat'])} "
        f"({time.time() - t0:.1f}s)")
    return res
