#!/usr/bin/env bash
# gpu-session.sh stage `mutation` (development aid for this project's workplace; users run
# `make mutation-gpu`): runs the CUDA mutants packed on the build host by
# `tools/mutation/mutate.py --gpu --build-only .devcarry/mutation` (or $MUTATION_ARCHIVE); the
# results JSON and every binary's log go under $1.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-/tmp/out}
exec python3 tools/mutation/mutate.py --gpu --run "${MUTATION_ARCHIVE:-.devcarry/mutation/mutation-gpu.tar.xz}" \
  --results "$out" --logs "$out/mutation-logs"
