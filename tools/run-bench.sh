#!/usr/bin/env bash
# `make bench`: runs every built benchmark binary (bench_*); each writes its own JSON to
# bench/results/ with date, commit and hardware.
set -euo pipefail
BUILD=${1:-build}
cd "$(dirname "$0")/.."
shopt -s nullglob
for b in "$BUILD"/bench_*; do
  echo "== $(basename "$b")"
  "$b"
done
