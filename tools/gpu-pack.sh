#!/usr/bin/env bash
# Packs what the lent GPU machine needs to run tools/run-gpu-tests.sh without building there: the
# sm_90a build of `tandem` and `test_cuda` (stripped) and the Debian shared libraries an Ubuntu
# CUDA image lacks, into .devcarry/gpu.tar.xz (ignored by git). Development aid for this project's
# own workplace; users build with `make` on their GPU host.
set -euo pipefail
BUILD=${1:-build-cuda}
cd "$(dirname "$0")/.."
stage=$(mktemp -d)
mkdir -p "$stage/bin" "$stage/lib" .devcarry
for b in tandem test_cuda; do strip -o "$stage/bin/$b" "$BUILD/$b"; done
# Every shared library except the C/C++ runtime and CUDA's own (the target image has those).
for lib in $(ldd "$BUILD/tandem" "$BUILD/test_cuda" | awk '/=>/ {print $3}' | sort -u); do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|libstdc++*|libgcc_s*|ld-linux*|libcuda*|libcublas*) ;;
    *) cp -L "$lib" "$stage/lib/" ;;
  esac
done
XZ_OPT=-9e tar -C "$stage" -cJf .devcarry/gpu.tar.xz bin lib
rm -rf "$stage"
ls -la .devcarry/gpu.tar.xz
