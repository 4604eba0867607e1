#!/usr/bin/env python3
"""Parity vectors from the Python binding of HF `tokenizers` (cross-check of another version).

Re-encodes the texts, and re-decodes the id lists, of a vectors file made by
make_parity_vectors.mjs, so both bindings/versions are compared on identical inputs:

  python3 make_parity_vectors.py --tokenizer T.json --texts-from V.json --out O.json --name N

The output has the same format; tests/text/tokenizer_parity_test.cpp replays it through
TANDEM_TOKENIZER_PARITY=T.json:O.json.
"""
import argparse
import hashlib
import json

import tokenizers
from tokenizers import Tokenizer


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--texts-from", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--name", required=True)
    a = ap.parse_args()
    raw = open(a.tokenizer, "rb").read()
    tok = Tokenizer.from_str(raw.decode("utf-8"))
    src = json.load(open(a.texts_from, encoding="utf-8"))
    encode = []
    for v in src["encode"]:
        ids = tok.encode(v["text"], add_special_tokens=False).ids
        encode.append({"text": v["text"], "ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False)})
    decode = []
    for v in src["decode"]:
        ids = v["ids"]
        decode.append({"ids": ids,
                       "text": tok.decode(ids, skip_special_tokens=False),
                       "text_skip_special": tok.decode(ids, skip_special_tokens=True)})
    same = sum(1 for x, y in zip(encode, src["encode"]) if x["ids"] == y["ids"])
    out = {"name": a.name, "tokenizers": f"tokenizers {tokenizers.__version__} (Python binding)",
           "tokenizer_sha256": hashlib.sha256(raw).hexdigest(),
           "vocab_size": tok.get_vocab_size(with_added_tokens=True),
           "encode": encode, "decode": decode}
    with open(a.out, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False)
        f.write("\n")
    print(f"{a.name}: tokenizers {tokenizers.__version__}: {len(encode)} encode "
          f"({same} identical to {src.get('tokenizers')}), {len(decode)} decode -> {a.out}")


if __name__ == "__main__":
    main()
