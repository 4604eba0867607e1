#!/usr/bin/env bash
# Prepares the built-in model directory for `make run`: the trained checkpoint shipped in
# data/builtin/ when present, else a tiny random-weight checkpoint from `tandem make-tiny`.
# Always verified with `tandem check` before use.
set -euo pipefail
TANDEM=${1:-build/tandem}
OUT=${2:-models/builtin}
cd "$(dirname "$0")/.."
if [[ ! -f "$OUT/config.json" ]]; then
  if [[ -f data/builtin/config.json ]]; then
    mkdir -p "$(dirname "$OUT")"
    cp -r data/builtin "$OUT"
  else
    "$TANDEM" make-tiny "$OUT" --seed 0 --preset default
  fi
fi
"$TANDEM" check "$OUT"
