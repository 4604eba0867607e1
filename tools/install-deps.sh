#!/usr/bin/env bash
# Installs the Debian packages Tandem needs to build and test, when missing. Idempotent and quiet
# when everything is present. CUDA (nvcc, cuBLAS, NCCL) is used when installed, never installed here.
# On Debian x86-64 it also installs the aarch64 cross build's (tools/aarch64/run.sh, whose smoke
# `make test` runs): the cross compiler, qemu-user-static and the arm64 libraries (multiarch).
set -euo pipefail

PKGS=(build-essential cmake ninja-build pkg-config git
      nlohmann-json3-dev libcpp-httplib-dev libcli11-dev libfmt-dev libpcre2-dev libssl-dev
      libgtest-dev libgmock-dev libbenchmark-dev libomp-dev libzmq3-dev
      clang libclang-rt-14-dev
      nodejs npm curl python3)
# The CPU build's libraries for aarch64 (header-only ones are architecture-independent), and the
# OpenMP runtime its test binaries load under qemu (the cross compiler links against its own copy).
ARM64_LIBS=(libcpp-httplib-dev libfmt-dev libpcre2-dev libssl-dev libgtest-dev libgmock-dev libzmq3-dev libgomp1)

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }

missing=()
for p in "${PKGS[@]}"; do installed "$p" || missing+=("$p"); done
# A node from elsewhere (nvm, tarball) is fine: only install Debian's when none is on PATH.
if command -v node >/dev/null && command -v npm >/dev/null; then
  filtered=()
  for p in "${missing[@]}"; do [[ "$p" == nodejs || "$p" == npm ]] || filtered+=("$p"); done
  missing=("${filtered[@]}")
fi

cross=0
if [[ $(dpkg --print-architecture 2>/dev/null) == amd64 ]] && grep -qx 'ID=debian' /etc/os-release 2>/dev/null; then
  cross=1
  for p in g++-aarch64-linux-gnu qemu-user-static; do installed "$p" || missing+=("$p"); done
  for p in "${ARM64_LIBS[@]}"; do installed "$p:arm64" || missing+=("$p:arm64"); done
fi

if ((${#missing[@]} == 0)); then
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
if ((cross)) && ! dpkg --print-foreign-architectures | grep -qx arm64; then
  echo "install-deps: adding the arm64 architecture (multiarch) for the aarch64 cross build"
  $SUDO dpkg --add-architecture arm64
fi
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
