#!/usr/bin/env bash
# On the lent GPU machine (see tools/gpu-pack.sh): unpacks the carried build at the paths the test
# binary was built with, then runs tools/run-gpu-tests.sh, writing results under $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
mkdir -p /work && ln -sfn "$root" /work/main   # TANDEM_SOURCE_DIR / TANDEM_BINARY of the carried build
mkdir -p build-cuda && tar -C build-cuda -xJf .devcarry/gpu.tar.xz
mv build-cuda/bin/* build-cuda/ && rmdir build-cuda/bin
export LD_LIBRARY_PATH=$root/build-cuda/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
missing=$(ldd build-cuda/tandem build-cuda/test_cuda | grep "not found" || true)
[[ -z "$missing" ]] || { echo "missing libraries: $missing"; exit 3; }
tools/run-gpu-tests.sh build-cuda "${OUT:-/tmp/out}"
