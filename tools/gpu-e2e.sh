#!/usr/bin/env bash
# On the lent GPU machine: the end-to-end suite (tools/e2e.sh: the official openai SDK, raw
# sockets, a 64-client load test, clean SIGTERM) against `tandem serve --device cuda` on a tiny
# checkpoint in the official format made there (tandem make-tiny), with DSpark on. Needs the
# carried build (tools/gpu-pack.sh) and node (tools/gpu-pack-e2e.sh). Log and summary under $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out=${OUT:-/tmp/out}
mkdir -p "$out"
if [[ ! -x build-cuda/tandem ]]; then
  mkdir -p /work && ln -sfn "$root" /work/main
  mkdir -p build-cuda && tar -C build-cuda -xJf .devcarry/gpu.tar.xz
  mv build-cuda/bin/* build-cuda/ && rmdir build-cuda/bin
fi
export LD_LIBRARY_PATH=$root/build-cuda/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
mkdir -p /tmp/e2e-node && tar -C /tmp/e2e-node -xJf .devcarry/e2e.tar.xz
export PATH=/tmp/e2e-node/bin:$PATH
rm -rf tests/e2e/node_modules && cp -r /tmp/e2e-node/node_modules tests/e2e/node_modules
tiny=/tmp/tandem-e2e-tiny
rm -rf "$tiny"
build-cuda/tandem make-tiny "$tiny" --seed 0 --preset ${E2E_TINY_PRESET:-default} || exit 1
E2E_SERVE_ARGS="--device cuda --speculative-config {\"method\":\"dspark\",\"num_speculative_tokens\":3} ${E2E_SERVE_ARGS:-}" \
  bash tools/e2e.sh "$tiny" build-cuda 2>&1 | tee "$out/gpu-e2e.log"
rc=${PIPESTATUS[0]}
pass=$(grep -c "^# pass" "$out/gpu-e2e.log" || true)
echo "{\"suite\": \"tools/e2e.sh against tandem serve --device cuda (make-tiny checkpoint)\", \"exit\": $rc, \"log\": \"gpu-e2e.log\", \"gpu\": \"$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)\", \"driver\": \"$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)\", \"commit\": \"${TANDEM_COMMIT:-unknown}\", \"date\": \"$(date -u +%Y-%m-%d)\"}" > "$out/gpu-e2e.json"
exit $rc
