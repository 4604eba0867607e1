#!/usr/bin/env bash
# Prepares the built-in model directory for `make run`: the trained checkpoint shipped in
# data/builtin/ when present, else a tiny random-weight checkpoint from `tandem make-tiny`.
# Always verified with `tandem check` before use.
set -euo pipefail
TANDEM=${1:-build/tandem}
OUT=${2:-models/builtin}
cd "$(dirname "$0")/.."
if [[ -f data/builtin/config.json ]]; then
  # A copy left by an earlier checkout is replaced when the shipped model changed.
  if ! diff -rq data/builtin "$OUT" >/dev/null 2>&1; then
    rm -rf "$OUT"
    mkdir -p "$(dirname "$OUT")"
    cp -r data/builtin "$OUT"
  fi
elif [[ ! -f "$OUT/config.json" ]]; then
  "$TANDEM" make-tiny "$OUT" --seed 0 --preset default
fi
"$TANDEM" check "$OUT"
