# Writes N random conversations with the prompts the official DeepSeek-V4 encoder renders for them
# (one JSON object per line: messages, thinking, drop_thinking, reasoning_effort, expected).
# Usage: python3 gen_cases.py N SEED  with the official encoding/encoding_dsv4.py on PYTHONPATH.
import json, random, sys

from encoding_dsv4 import encode_messages

R = random.Random(int(sys.argv[2]) if len(sys.argv) > 2 else 7)
WORDS = ["hello", "世界", "😀", "a\"b", "back\\slash", "line\nbreak", "tab\there", "  ", "", "x", "{json}", "</think>", "é", "\u0001ctl", "end."]

def text(maxw=5):
    return "".join(R.choice(WORDS) + R.choice([" ", "", "\n"]) for _ in range(R.randint(0, maxw)))

def value(depth=0):
    k = R.randint(0, 8 if depth < 2 else 5)
    if k == 0: return R.randint(-1000, 10**6)
    if k == 1: return R.choice([0.5, 1.0, -2.25, 1e-7, 3.14159, 1e20, 123456.789, 0.1])
    if k == 2: return R.choice([True, False, None])
    if k in (3, 4, 5): return text(3)
    if k == 6: return [value(depth + 1) for _ in range(R.randint(0, 3))]
    return {R.choice(["a", "b", "名", "key x", "z"]) + str(i): value(depth + 1) for i in range(R.randint(0, 3))}

def tool_def(i):
    return {"type": "function", "function": {"name": f"tool_{i}", "description": text(3),
            "parameters": {"type": "object", "properties": {"p": {"type": R.choice(["string", "integer"])}}, "required": ["p"]}}}

def args_string():
    if R.random() < 0.05: return "not json at all"
    d = {R.choice(["q", "path", "n", "opts", "名字"]) + str(i): value() for i in range(R.randint(0, 3))}
    return json.dumps(d, ensure_ascii=R.random() < 0.5, separators=R.choice([(",", ":"), (", ", ": ")]))

def conversation():
    msgs = []
    if R.random() < 0.7:
        m = {"role": "system", "content": text()}
        if R.random() < 0.25: m["tools"] = [tool_def(i) for i in range(R.randint(1, 2))]
        if R.random() < 0.15: m["response_format"] = {"type": "json_schema", "schema": {"type": "object", "n": R.random() < 0.5}}
        msgs.append(m)
    if R.random() < 0.3: msgs.append({"role": "latest_reminder", "content": text(2)})
    ncalls_pending = []
    for turn in range(R.randint(1, 4)):
        r = R.random()
        if r < 0.1:
            m = {"role": "developer", "content": text() or "dev"}
            if R.random() < 0.3: m["tools"] = [tool_def(0)]
            msgs.append(m)
        else:
            m = {"role": "user", "content": text()}
            if R.random() < 0.08: m["task"] = R.choice(["action", "query", "title", "domain", "authority", "read_url"])
            msgs.append(m)
            if R.random() < 0.1: msgs.append({"role": "user", "content": text(2)})
        if R.random() < 0.15: msgs.append({"role": "latest_reminder", "content": text(2)})
        # assistant, possibly with tool calls and tool results
        while True:
            a = {"role": "assistant", "content": text()}
            if R.random() < 0.7: a["reasoning_content"] = text()
            if R.random() < 0.4:
                n = R.randint(1, 3)
                calls = []
                for i in range(n):
                    c = {"type": "function", "function": {"name": f"tool_{i}", "arguments": args_string()}}
                    c["id"] = f"call_{turn}_{i}"
                    calls.append(c)
                a["tool_calls"] = calls
                msgs.append(a)
                order = list(range(n)); R.shuffle(order)
                for i in order:
                    msgs.append({"role": "tool", "tool_call_id": f"call_{turn}_{i}", "content": text(3)})
                if R.random() < 0.5: break
                continue
            if R.random() < 0.1: a["wo_eos"] = True
            msgs.append(a)
            break
        if R.random() < 0.2 and turn > 0: break
    if R.random() < 0.6:
        msgs.append({"role": "user", "content": text()})  # ask for a new answer
    return msgs

def main():
    n = int(sys.argv[1])
    out = []
    fails = 0
    while len(out) < n:
        msgs = conversation()
        thinking = R.random() < 0.6
        drop = R.random() < 0.8
        effort = R.choice([None, None, "max"])
        try:
            exp = encode_messages(json.loads(json.dumps(msgs)), thinking_mode="thinking" if thinking else "chat",
                                  drop_thinking=drop, reasoning_effort=effort)
        except Exception as e:
            fails += 1
            continue
        # preview "max" text == 0731 "high" text
        out.append({"messages": msgs, "thinking": thinking, "drop_thinking": drop,
                    "reasoning_effort": "high" if effort == "max" else "", "expected": exp})
    for c in out:
        print(json.dumps(c, ensure_ascii=False))
    print(f"{fails} inputs rejected by the official encoder", file=sys.stderr)


if __name__ == "__main__":
    main()
