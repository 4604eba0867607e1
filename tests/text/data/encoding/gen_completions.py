# Writes N assistant completions rendered by the official DeepSeek-V4 encoder and what its
# parse_message_from_completion_text returns for them (one JSON object per line: text, thinking,
# reasoning_content, content, tool_calls as [name, arguments]).
# Usage: python3 gen_completions.py N SEED  with encoding/encoding_dsv4.py and gen_cases.py on PYTHONPATH.
import json, random, sys

import gen_cases as gen
from encoding_dsv4 import encode_messages, parse_message_from_completion_text


def main():
    R = random.Random(int(sys.argv[2]) if len(sys.argv) > 2 else 5)
    gen.R = R
    out = []
    while len(out) < int(sys.argv[1]):
        thinking = R.random() < 0.5
        a = {"role": "assistant", "content": gen.text()}
        if thinking:
            a["reasoning_content"] = gen.text()
        if R.random() < 0.6:
            a["tool_calls"] = [{"type": "function", "function": {"name": f"tool_{i}", "arguments": gen.args_string()}}
                               for i in range(R.randint(1, 3))]
        msgs = [{"role": "user", "content": "q"}, a]
        mode = "thinking" if thinking else "chat"
        prompt = encode_messages(msgs, thinking_mode=mode, drop_thinking=False)
        marker = "<｜Assistant｜>" + ("<think>" if thinking else "</think>")
        text = prompt[prompt.index(marker) + len(marker):]
        try:
            r = parse_message_from_completion_text(text, thinking_mode=mode)
        except Exception:
            continue  # e.g. reasoning that contains "</think>": the official parser rejects it
        out.append({"text": text, "thinking": thinking, "reasoning_content": r["reasoning_content"],
                    "content": r["content"],
                    "tool_calls": [[t["function"]["name"], t["function"]["arguments"]] for t in r["tool_calls"]]})
    for o in out:
        print(json.dumps(o, ensure_ascii=False))


if __name__ == "__main__":
    main()
