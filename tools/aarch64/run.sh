#!/usr/bin/env bash
# The CPU build for aarch64 (the GB10 hosts' CPU), cross-compiled with Debian's
# g++-aarch64-linux-gnu against the arm64 multiarch packages (tools/install-deps.sh installs both),
# its tests run under qemu-user-static.
#   smoke  (in `make test`): builds the CPU ops and their suite (test_kernels), runs it emulated.
#   full   (`make test-aarch64`): builds everything, runs every unit suite emulated, writes
#          bench/results/aarch64-emulated-<date>.json (date, commit, machine, times, per suite).
# Usage: tools/aarch64/run.sh smoke|full [BUILD_DIR]   (JOBS=N for the build, default nproc)
# On an aarch64 host there is nothing to emulate: the native `make test` is the aarch64 run. Exit
# 77 (skipped) where the cross toolchain is missing and install-deps.sh would not install it.
set -uo pipefail
MODE=${1:-smoke}
BUILD=${2:-build-aarch64}
JOBS=${JOBS:-$(nproc)}
RESULTS=${RESULTS:-bench/results}
cd "$(dirname "$0")/../.."

case "$MODE" in smoke | full) ;; *) echo "usage: $0 smoke|full [BUILD_DIR]" >&2; exit 2 ;; esac
if [[ $(uname -m) == aarch64 ]]; then
  echo "aarch64: this host is aarch64; the native build and \`make test\` run the suites without emulation"
  exit 77
fi

# ---- prerequisites (make deps installs them on Debian x86-64) ----
missing=()
command -v aarch64-linux-gnu-g++ >/dev/null || missing+=("g++-aarch64-linux-gnu")
command -v qemu-aarch64-static >/dev/null || missing+=("qemu-user-static")
for pc in libzmq libpcre2-8 fmt cpp-httplib libcrypto gtest; do
  [[ -f /usr/lib/aarch64-linux-gnu/pkgconfig/$pc.pc ]] || missing+=("arm64 $pc (.pc)")
done
[[ -f /usr/lib/aarch64-linux-gnu/libgomp.so.1 ]] || missing+=("libgomp1:arm64")
if ((${#missing[@]})); then
  echo "aarch64: missing ${missing[*]}: run \`make deps\` (installs the cross toolchain and the arm64 packages on Debian)" >&2
  # Where install-deps.sh does not install them (not Debian x86-64) the run is skipped (exit 77).
  if [[ $(dpkg --print-architecture 2>/dev/null) == amd64 ]] && grep -qx 'ID=debian' /etc/os-release 2>/dev/null; then
    exit 1
  fi
  echo "aarch64: SKIPPED (this is not Debian x86-64)" >&2
  exit 77
fi

# Test binaries start other aarch64 programs (`tandem`, tensor-parallel workers); the kernel runs
# those through binfmt_misc. Register qemu for aarch64 ELF files when missing and permitted.
binfmt_ok() { [[ -f /proc/sys/fs/binfmt_misc/qemu-aarch64 ]] && grep -q '^enabled' /proc/sys/fs/binfmt_misc/qemu-aarch64; }
if ! binfmt_ok && [[ $(id -u) -eq 0 ]]; then
  [[ -f /proc/sys/fs/binfmt_misc/register ]] || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc 2>/dev/null
  if [[ -f /proc/sys/fs/binfmt_misc/register && -f /usr/lib/binfmt.d/qemu-aarch64.conf ]]; then
    cat /usr/lib/binfmt.d/qemu-aarch64.conf > /proc/sys/fs/binfmt_misc/register 2>/dev/null || true
  fi
fi
if binfmt_ok; then binfmt=registered; else
  binfmt=missing
  echo "aarch64: WARNING: no binfmt_misc entry for aarch64 (not root, or no binfmt_misc here): suites that start" \
       "\`tandem\` or worker processes will fail; on Debian, installing qemu-user-static with systemd registers it" >&2
fi

# ---- configure and build ----
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
if [[ ! -f "$BUILD/build.ninja" ]]; then
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_TOOLCHAIN_FILE=tools/aarch64/toolchain.cmake \
    -DTANDEM_CUDA=OFF -DTANDEM_BENCH=OFF "${launcher[@]}" >/dev/null || { echo "aarch64: configure FAILED" >&2; exit 1; }
fi
targets=()
[[ $MODE == smoke ]] && targets=(--target test_kernels)
t0=$(date +%s)
if ! cmake --build "$BUILD" -j "$JOBS" "${targets[@]}"; then
  echo "aarch64: build FAILED" >&2
  exit 1
fi
build_s=$(($(date +%s) - t0))
echo "aarch64: built in ${build_s}s ($MODE, -j $JOBS)"

# ---- run under emulation (ctest prefixes qemu-aarch64-static: CMAKE_CROSSCOMPILING_EMULATOR) ----
t1=$(date +%s)
filter=()
[[ $MODE == smoke ]] && filter=(-R '^kernels$')
(cd "$BUILD" && ctest --output-on-failure -j1 "${filter[@]}")
rc=$?
test_s=$(($(date +%s) - t1))
echo "aarch64: emulated suites ran in ${test_s}s (exit $rc)"
[[ $MODE == smoke ]] && exit $rc

# ---- full: the record ----
mkdir -p "$RESULTS"
date=$(date -u +%Y-%m-%d)
commit=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
dirty=$([[ -n $(git status --porcelain --untracked-files=no 2>/dev/null) ]] && echo true || echo false)
python3 - "$BUILD" "$RESULTS/aarch64-emulated-$date.json" "$date" "$commit" "$dirty" "$build_s" "$test_s" "$JOBS" \
  "$binfmt" <<'PY'
import json, os, platform, re, subprocess, sys
build, dst, date, commit, dirty, build_s, test_s, jobs, binfmt = sys.argv[1:]
def first_line(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True).stdout.splitlines()[0].strip()
    except Exception:
        return "unknown"
cpu = "unknown"
for line in open("/proc/cpuinfo"):
    if line.startswith("model name"):
        cpu = line.split(":", 1)[1].strip(); break
log = open(os.path.join(build, "Testing/Temporary/LastTest.log"), errors="replace").read()
suites = []
# ctest's log: per test "<n>/<m> Testing: <name>", the command and its output, "Test time = <s> sec",
# "Test Passed." or "Test Failed.", then "\"<name>\" end time: ...".
for m in re.finditer(r"^\d+/\d+ Testing: (\S+)\n(.*?)^\"\1\" end time:", log, re.M | re.S):
    name, block = m.group(1), m.group(2)
    t = re.search(r"^Test time =\s+([\d.]+) sec", block, re.M)
    ok = re.search(r"^Test Passed\.", block, re.M) is not None
    failed = sorted(set(re.findall(r"^\[  FAILED  \] (\S+) \(\d+ ms\)$", block, re.M)))
    suites.append({"suite": name, "status": "pass" if ok else "fail",
                   "seconds": float(t.group(1)) if t else None,
                   "cases_passed": len(re.findall(r"^\[       OK \] ", block, re.M)),
                   "cases_failed": len(failed), "failed_cases": failed})
out = {"date": date, "commit": commit, "dirty_tree": dirty == "true",
       "what": "CPU build (-DTANDEM_CUDA=OFF) cross-compiled for aarch64 with Debian's g++-aarch64-linux-gnu "
               "against arm64 multiarch packages; every unit suite (ctest) run under qemu-user-static",
       "machine": {"host_cpu": cpu, "host_arch": platform.machine(), "nproc": os.cpu_count(),
                   "build_jobs": int(jobs), "compiler": first_line(["aarch64-linux-gnu-g++", "--version"]),
                   "emulator": first_line(["qemu-aarch64-static", "--version"]), "binfmt_aarch64": binfmt,
                   "load_average_after": open("/proc/loadavg").read().split()[:3]},
       "build_seconds": int(build_s), "test_seconds": int(test_s),
       "suites": suites,
       "passed": sum(s["status"] == "pass" for s in suites), "failed": sum(s["status"] == "fail" for s in suites)}
json.dump(out, open(dst, "w"), indent=1)
for s in suites:
    print(f"  {s['suite']:<10} {s['status']:<4} {s['seconds'] or 0:>8.1f} s  {s['cases_passed']} cases passed, "
          f"{s['cases_failed']} failed {' '.join(s['failed_cases'])}")
print("wrote", dst)
PY
exit $rc
