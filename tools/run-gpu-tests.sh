#!/usr/bin/env bash
# `make test-gpu`: runs the CUDA test binaries (tests built from tests/cuda/, named test_cuda*) on
# a machine with an NVIDIA GPU and writes a results JSON (date, commit, hardware) to bench/results/.
set -euo pipefail
BUILD=${1:-build}
cd "$(dirname "$0")/.."
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "test-gpu: no NVIDIA GPU visible on this machine; run it on a GPU host" >&2
  exit 2
fi
shopt -s nullglob
bins=("$BUILD"/test_cuda*)
if ((${#bins[@]} == 0)); then
  echo "test-gpu: no CUDA tests are built yet (the CUDA backend has not landed)" >&2
  exit 2
fi
date=$(date -u +%Y-%m-%d)
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
out="bench/results/gpu-tests-$date-$commit.json"
rc=0
results=()
for b in "${bins[@]}"; do
  name=$(basename "$b")
  if "$b" --gtest_output="json:$BUILD/$name.json"; then status=pass; else status=fail; rc=1; fi
  results+=("{\"binary\":\"$name\",\"status\":\"$status\"}")
done
printf '{"date":"%s","commit":"%s","gpu":"%s","results":[%s]}\n' "$date" "$commit" "$gpu" \
  "$(IFS=,; echo "${results[*]}")" >"$out"
echo "test-gpu: wrote $out"
exit $rc
