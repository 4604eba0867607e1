#!/usr/bin/env bash
# Installs the Debian packages Tandem needs to build and test, when missing. Idempotent and quiet
# when everything is present. CUDA (nvcc, cuBLAS, NCCL) is used when installed, never installed here.
set -euo pipefail

PKGS=(build-essential cmake ninja-build pkg-config git
      nlohmann-json3-dev libcpp-httplib-dev libcli11-dev libfmt-dev libpcre2-dev libssl-dev
      libgtest-dev libgmock-dev libbenchmark-dev libomp-dev libzmq3-dev
      clang libclang-rt-14-dev
      nodejs npm curl python3)

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
# A node from elsewhere (nvm, tarball) is fine: only install Debian's when none is on PATH.
if command -v node >/dev/null && command -v npm >/dev/null; then
  filtered=()
  for p in "${missing[@]}"; do [[ "$p" == nodejs || "$p" == npm ]] || filtered+=("$p"); done
  missing=("${filtered[@]}")
fi
if ((${#missing[@]} == 0)); then
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
