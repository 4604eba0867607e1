#!/usr/bin/env bash
# Builds a variant of `tandem` from an existing build directory without a second build tree: the
# given sources are compiled again with extra flags (e.g. -DEXP_LEAD=3 for a compile-time switch an
# experiment added), their objects replace the originals in copies of the static libraries, and
# `tandem` (or each of $VARIANT_TARGETS, e.g. "tandem test_cuda") is relinked against those copies
# into OUTDIR/NAME/ (stripped). About a minute per variant for one or two CUDA files, so one device
# call can time several builds of a kernel side by side (docs/PERFORMANCE.md, "Eighteenth session").
# Development aid for this project's own workplace, like tools/gpu-pack.sh.
# Usage: tools/gpu-variants.sh BUILD_DIR OUTDIR NAME "FLAGS" SOURCE [SOURCE...]
#   e.g. tools/gpu-variants.sh build-cuda /tmp/var lead3 "-DEXP_LEAD=3" src/model/cuda/moe_prefill_ws.cu
set -euo pipefail
if [[ $# -lt 5 ]]; then
  sed -n '2,9p' "$0" >&2
  exit 2
fi
BUILD=$(cd "$1" && pwd)
OUTDIR=$2
NAME=$3
FLAGS=$4
shift 4
root=$(cd "$(dirname "$0")/.." && pwd)
out=$OUTDIR/$NAME
rm -rf "$out"
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$BUILD"
declare -A libs  # static library -> the variant objects it takes
direct=()        # (object, variant object) pairs linked into an executable itself
for src in "$@"; do
  src=${src#"$root"/}  # a path from the repository root
  # The object ninja builds from this source: CMakeFiles/<target>.dir/<path>.o
  obj=$(ninja -t targets all | grep -F ".dir/$src.o:" | head -1 | cut -d: -f1)
  if [[ -z "$obj" ]]; then
    echo "gpu-variants: no object for $src in $BUILD" >&2
    exit 1
  fi
  target=${obj#CMakeFiles/}
  target=${target%%.dir/*}
  dst=$out/$(basename "$obj")
  cmd=$(ninja -t commands "$obj" | tail -1 | sed "s# -o [^ ]*# -o $dst#; s#-MD -MT [^ ]* -MF [^ ]*##")
  # shellcheck disable=SC2086
  bash -c "$cmd $FLAGS"
  if [[ ! -f lib$target.a ]]; then
    direct+=("$obj" "$dst")  # linked into an executable itself
  else
    lib=lib$target.a
    libs[$lib]="${libs[$lib]:-} $dst"
  fi
done
for lib in "${!libs[@]}"; do
  cp "$lib" "$out/$lib"
  # shellcheck disable=SC2086
  ar r "$out/$lib" ${libs[$lib]}
done
# Each target's link line with the variant objects and library copies in place of the originals.
for t in ${VARIANT_TARGETS:-tandem}; do
  link=$(ninja -t commands "$t" | tail -1)
  for ((i = 0; i < ${#direct[@]}; i += 2)); do link=${link// ${direct[i]} / ${direct[i + 1]} }; done
  for lib in "${!libs[@]}"; do link=${link// $lib / $out/$lib }; done
  link=${link/ -o $t / -o $out/$t }
  bash -c "$link"
  strip "$out/$t"
  echo "$out/$t"
done
