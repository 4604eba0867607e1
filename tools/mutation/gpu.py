#!/usr/bin/env python3
"""Mutation check for the CUDA kernels (`make mutation-gpu`, issue 20): does a GPU test fail when a
kernel the forward calls is off by a rounding, a sign, a position or a bit order?

The faults are tools/mutation/faults-gpu.json: id, what, gtest filter (the tests that should catch
it; no negative patterns), optionally what is expected to catch it (expect), and one edit (file,
search, replace) or several ("edits": [{file?, search, replace, count?}]); a search text must occur
exactly once (or `count` times, all replaced) in the file as it is at that edit.
A GPU host need not be able to build, so the work is split in two:

  mutate.py --gpu --build-only OUTDIR [--only ID,ID] [--jobs N] [--arch 90a]
      here: a scratch copy of the working tree, one build directory (ccache), the test_cuda_ops
      target unmutated (the baseline) and once per fault, each stripped; with the shared libraries
      the binary needs beyond the C/C++ and CUDA runtimes, packed into OUTDIR/mutation-gpu.tar.xz
      (xz, 64 MiB dictionary: a mutant differs from the baseline in one object, so adds little).
      Exit 0: every fault built; 1: the archive holds the others, the listed faults are stale (search
      text not found exactly once), do not compile, or leave the binary unchanged; 2: no archive.
  mutate.py --gpu --run ARCHIVE [--results DIR] [--logs DIR] [--timeout S]
      on the GPU host (python3 only): the baseline with the union of the filters (must run; a test
      that fails there cannot catch a fault and is left out of every mutant's filter, and reported),
      then each mutant with its filter and a time limit. A fault is caught when one of its tests
      fails, crashes or times out. Writes DIR/mutation-gpu-<date>-<gpu>.json (default
      bench/results) and exits 1 if any fault is not caught, 2 if the baseline could not run.
  mutate.py --gpu --check [--no-compile] [--only ID,ID]
      no GPU needed: every search text applies exactly once and every mutated file compiles (its
      object only; a header fault builds the target). For refreshing the list after kernels change.
  mutate.py --gpu
      where a GPU is: --build-only into the scratch directory, then --run of that archive.
"""
import argparse
import datetime
import json
import lzma
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time

from common import ROOT, sh, sync_tree

TARGET = "test_cuda_ops"
ARCHIVE = "mutation-gpu.tar.xz"
# Shared libraries the GPU host has (gpu-pack.sh's rule): the C/C++ runtime and CUDA's own.
HOST_LIBS = re.compile(r"^(libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so|libstdc\+\+|libgcc_s|ld-linux|"
                       r"libcuda|libcublas)")


# ---------------------------------------------------------------- fault list
def load_faults(path, only):
    with open(path) as f:
        faults = json.load(f)
    ids = [x["id"] for x in faults]
    dup = {i for i in ids if ids.count(i) > 1}
    if dup:
        raise SystemExit(f"{path}: duplicate fault ids {sorted(dup)}")
    for x in faults:
        for key in ("id", "what", "filter"):
            if not x.get(key):
                raise SystemExit(f"{path}: fault {x.get('id', '?')} has no {key}")
        if "-" in x["filter"]:
            raise SystemExit(f"{path}: fault {x['id']}: the filter lists the tests that should catch it "
                             "(no negative patterns)")
        if not re.fullmatch(r"[A-Za-z0-9_-]+", x["id"]):
            raise SystemExit(f"{path}: fault id {x['id']!r}: letters, digits, '-' and '_' only")
        for e in edits_of(x):
            if not e.get("file") or "search" not in e or "replace" not in e:
                raise SystemExit(f"{path}: fault {x['id']}: an edit needs file, search and replace")
    if only:
        keep = set(only.split(","))
        unknown = keep - set(ids)
        if unknown:
            raise SystemExit(f"unknown fault ids: {', '.join(sorted(unknown))}")
        faults = [x for x in faults if x["id"] in keep]
    return faults


def edits_of(fault):
    if "edits" in fault:
        return [{"file": e.get("file", fault.get("file")), **{k: v for k, v in e.items() if k != "file"}}
                for e in fault["edits"]]
    return [{"file": fault.get("file"), "search": fault.get("search"), "replace": fault.get("replace")}]


def files_of(fault):
    return sorted({e["file"] for e in edits_of(fault)})


def short(text, n=70):
    t = text.replace("\n", "\\n")
    return t if len(t) <= n else t[:n - 3] + "..."


def apply_fault(tree, fault):
    """Applies the fault's edits in order. Returns (originals {path: text}, None) or (None, why) when
    a search text does not occur exactly once; nothing is left changed then."""
    texts, originals = {}, {}
    for i, e in enumerate(edits_of(fault)):
        path = os.path.join(tree, e["file"])
        if path not in texts:
            if not os.path.exists(path):
                return None, f"{e['file']}: no such file"
            with open(path) as f:
                texts[path] = originals[path] = f.read()
        n, want = texts[path].count(e["search"]), e.get("count", 1)
        if n != want:
            which = f"edit {i + 1} of {len(edits_of(fault))}: " if "edits" in fault else ""
            return None, (f"stale: {which}{e['file']}: search text found {n} times"
                          f"{'' if want == 1 else f' (not {want})'}: '{short(e['search'])}'")
        texts[path] = texts[path].replace(e["search"], e["replace"])
    for path, text in texts.items():
        with open(path, "w") as f:
            f.write(text)
    return originals, None


def restore(originals):
    for path, text in (originals or {}).items():
        with open(path, "w") as f:
            f.write(text)


# ---------------------------------------------------------------- build side
class Builder:
    def __init__(self, scratch, arch, jobs):
        self.scratch, self.arch, self.jobs = scratch, arch, jobs
        self.tree = os.path.join(scratch, "tree")
        self.build = os.path.join(self.tree, "build")
        self.env = dict(os.environ)
        # Paths under the scratch tree hash like the worktree's (relative), so ccache serves its objects.
        self.env["CCACHE_BASEDIR"] = scratch

    def prepare(self):
        os.makedirs(self.tree, exist_ok=True)
        sync_tree(self.tree, prune=True)
        cache = os.path.join(self.build, "CMakeCache.txt")
        if os.path.exists(cache) and f"TANDEM_CUDA_ARCH:STRING={self.arch}\n" not in open(cache).read():
            shutil.rmtree(self.build)
        if not os.path.exists(os.path.join(self.build, "build.ninja")):
            launch = ("-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache"
                      if shutil.which("ccache") else "")
            rc, out = sh(f"cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DTANDEM_CUDA=ON "
                         f"-DTANDEM_CUDA_ARCH={self.arch} -DTANDEM_BENCH=OFF {launch}", cwd=self.tree, env=self.env)
            if rc != 0:
                raise SystemExit("configure failed:\n" + out[-3000:])
        rc, out = sh("ninja -t targets all", cwd=self.build, env=self.env)
        if rc != 0 or f"{TARGET}:" not in out:
            raise SystemExit(f"no {TARGET} target in the build (a CUDA toolkit is needed to build it):\n{out[-2000:]}")
        self.objects = {}
        for line in out.splitlines():
            m = re.match(r"^(CMakeFiles/[^:]+\.dir/(.+)\.o):", line)
            if m:
                self.objects.setdefault(m.group(2), []).append(m.group(1))

    def ninja(self, targets):
        t0 = time.time()
        rc, out = sh(f"ninja -j{self.jobs} {' '.join(targets)}", cwd=self.build, env=self.env)
        return rc, out, time.time() - t0

    def compile_only(self, fault):
        """The objects of the mutated files (a header's dependants: the whole target)."""
        targets = []
        for f in files_of(fault):
            if f not in self.objects:
                return self.ninja([TARGET])
            targets += self.objects[f]
        return self.ninja(targets)


def strip_to(src, dst):
    rc, out = sh(f"strip -o '{dst}' '{src}'", cwd=os.path.dirname(src))
    if rc != 0:
        raise SystemExit(f"strip failed: {out}")


def shared_libs(binary):
    rc, out = sh(f"ldd '{binary}'", cwd="/")
    libs = []
    for line in out.splitlines():
        m = re.match(r"^\s*(\S+) => (/\S+)", line)
        if m and not HOST_LIBS.match(m.group(1)):
            libs.append(m.group(2))
    return libs


def git_commit():
    rc, out = sh("git rev-parse --short=12 HEAD", cwd=ROOT)
    commit = out.strip() if rc == 0 else "unknown"
    rc, out = sh("git status --porcelain --untracked-files=no", cwd=ROOT)
    return commit + ("+dirty" if rc == 0 and out.strip() else "")


def build_only(a, faults, outdir):
    b = Builder(a.scratch, a.arch, a.jobs)
    b.prepare()
    os.makedirs(outdir, exist_ok=True)
    stage = tempfile.mkdtemp(prefix="mutants.", dir=a.scratch)
    os.makedirs(os.path.join(stage, "bin"))
    os.makedirs(os.path.join(stage, "lib"))
    binary = os.path.join(b.build, TARGET)
    t_all = time.time()
    rc, out, dt = b.ninja([TARGET])
    if rc != 0:
        print(out[-4000:])
        print(f"the unmutated tree does not build {TARGET}: no archive")
        return 2
    strip_to(binary, os.path.join(stage, "bin", "baseline"))
    print(f"baseline: built in {dt:.0f} s", flush=True)
    with open(os.path.join(stage, "bin", "baseline"), "rb") as f:
        base_bytes = f.read()
    entries, problems = [], 0
    for x in faults:
        entry = {k: x[k] for k in ("id", "what", "filter")}
        entry["files"] = files_of(x)
        if x.get("expect"):
            entry["expect"] = x["expect"]
        originals, why = apply_fault(b.tree, x)
        if why:
            entry["status"] = why
        else:
            try:
                rc, out, dt = b.ninja([TARGET])
            finally:
                restore(originals)
            entry["build_s"] = round(dt)
            if rc != 0:
                entry["status"] = "does not compile"
                entry["build_log"] = out[-3000:]
            else:
                dst = os.path.join(stage, "bin", x["id"])
                strip_to(binary, dst)
                with open(dst, "rb") as f:
                    same = f.read() == base_bytes
                if same:
                    os.remove(dst)
                    entry["status"] = "no effect: the binary equals the baseline (code not compiled for this arch?)"
                else:
                    entry["status"] = "built"
                    entry["binary"] = f"bin/{x['id']}"
        if entry["status"] != "built":
            problems += 1
        print(f"{x['id']}: {entry['status']}" + (f" ({entry['build_s']} s)" if "build_s" in entry else ""), flush=True)
        if entry["status"] == "does not compile":
            print(entry["build_log"][-1500:])
        entries.append(entry)
    for lib in shared_libs(binary):
        shutil.copy2(lib, os.path.join(stage, "lib", os.path.basename(lib)))
    manifest = {"target": TARGET, "arch": a.arch, "commit": git_commit(),
                "built": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                "faults": entries}
    with open(os.path.join(stage, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    archive = os.path.join(outdir, ARCHIVE)
    t0 = time.time()
    # One xz stream with a 64 MiB dictionary, so each mutant compresses against the binary before it
    # (the baseline first, then the mutants in list order); the fast match finder still finds those
    # long matches and packs twenty mutants in about a minute, where -9e takes several.
    xz = [{"id": lzma.FILTER_LZMA2, "preset": 9, "mf": lzma.MF_HC4, "mode": lzma.MODE_FAST, "nice_len": 273,
           "depth": 16}]
    with lzma.open(archive + ".part", "wb", format=lzma.FORMAT_XZ, filters=xz) as f, \
            tarfile.open(fileobj=f, mode="w|") as tar:
        tar.add(os.path.join(stage, "manifest.json"), "manifest.json")
        for lib in sorted(os.listdir(os.path.join(stage, "lib"))):
            tar.add(os.path.join(stage, "lib", lib), f"lib/{lib}")
        tar.add(os.path.join(stage, "bin", "baseline"), "bin/baseline")
        for e in entries:
            if e.get("binary"):
                tar.add(os.path.join(stage, e["binary"]), e["binary"])
    os.replace(archive + ".part", archive)
    shutil.rmtree(stage)
    built = sum(e["status"] == "built" for e in entries)
    print(f"\n{archive}: {os.path.getsize(archive) / 2**20:.1f} MiB, baseline + {built} mutants "
          f"(packed in {time.time() - t0:.0f} s; {time.time() - t_all:.0f} s in all)")
    for e in entries:
        if e["status"] != "built":
            print(f"  NOT IN THE ARCHIVE: {e['id']}: {e['status']}")
    return 1 if problems else 0


def check(a, faults):
    b = Builder(a.scratch, a.arch, a.jobs) if not a.no_compile else None
    tree = os.path.join(a.scratch, "tree")
    if b:
        b.prepare()
    else:
        os.makedirs(tree, exist_ok=True)
        sync_tree(tree, prune=True)
    problems = 0
    for x in faults:
        originals, why = apply_fault(tree, x)
        status = why or "applies"
        if not why and b:
            try:
                rc, out, dt = b.compile_only(x)
            finally:
                restore(originals)
            status = f"compiles ({dt:.0f} s)" if rc == 0 else "DOES NOT COMPILE"
            if rc != 0:
                print(out[-2000:])
        else:
            restore(originals)
        if not status.startswith(("applies", "compiles")):
            problems += 1
        print(f"{x['id']}: {status}", flush=True)
    print(f"\n{len(faults) - problems} of {len(faults)} faults apply" + ("" if a.no_compile else " and compile"))
    return 1 if problems else 0


# ---------------------------------------------------------------- GPU side
def gpu_name():
    if not shutil.which("nvidia-smi"):
        return None, None
    p = subprocess.run("nvidia-smi --query-gpu=name,driver_version --format=csv,noheader", shell=True,
                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    if p.returncode != 0 or not p.stdout.strip():
        return None, None
    name, _, driver = p.stdout.strip().splitlines()[0].partition(",")
    return name.strip(), driver.strip()


def gpu_tag(name):
    t = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    return t[len("nvidia-"):] if t.startswith("nvidia-") else t


def gtest_cases(path):
    """{test: (status, seconds)} from gtest's JSON; status pass / fail / skipped."""
    with open(path) as f:
        doc = json.load(f)
    cases = {}
    for s in doc.get("testsuites", []):
        for c in s.get("testsuite", []):
            if c.get("status", "RUN") != "RUN":
                continue
            st = "fail" if c.get("failures") else ("skipped" if c.get("result") == "SKIPPED" else "pass")
            cases[f"{s['name']}.{c['name']}"] = (st, float(str(c.get("time", "0s")).rstrip("s") or 0))
    return cases


def run_tests(binary, filt, env, timeout, log_path, work):
    """Runs binary with the gtest filter. Returns (cases or None, note): note says crash / timeout."""
    js = os.path.join(work, "gtest.json")
    if os.path.exists(js):
        os.remove(js)
    cmd = [binary, f"--gtest_filter={filt}", f"--gtest_output=json:{js}", "--gtest_brief=1"]
    with open(log_path, "w") as log:
        try:
            p = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout, cwd=work)
            rc = p.returncode
        except subprocess.TimeoutExpired:
            return None, f"timed out after {timeout:.0f} s"
    if not os.path.exists(js):
        return None, f"exit {rc} before gtest's report (crash or abort)"
    cases = gtest_cases(js)
    if rc != 0 and not any(st == "fail" for st, _ in cases.values()):
        return cases, f"exit {rc} with no failed test"
    return cases, ""


def listed(binary, filt, env):
    p = subprocess.run([binary, f"--gtest_filter={filt}", "--gtest_list_tests"], env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, errors="replace", timeout=120)
    tests, suite = [], None
    for line in p.stdout.splitlines():
        if not line.strip() or line.startswith(("Running main", "Note:")):
            continue
        if not line.startswith(" "):
            suite = line.split()[0]
        else:
            tests.append(suite + line.split()[0])
    return tests


def run(a, archive):
    name, driver = gpu_name()
    if not name:
        print("mutation-gpu: no NVIDIA GPU visible on this machine (build the archive with --build-only and "
              "run it with --run on a GPU host)")
        return 2
    if not os.path.exists(archive):
        print(f"mutation-gpu: {archive}: no such archive")
        return 2
    work = tempfile.mkdtemp(prefix="tandem-mutation-run.")
    try:
        with tarfile.open(archive) as tar:
            try:
                tar.extractall(work, filter="data")
            except TypeError:  # Python without extraction filters
                tar.extractall(work)
        with open(os.path.join(work, "manifest.json")) as f:
            manifest = json.load(f)
        return run_extracted(a, work, manifest, name, driver)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run_extracted(a, work, manifest, name, driver):
    env = dict(os.environ)
    paths = [os.path.join(work, "lib")] + [p for p in ("/usr/local/cuda/lib64", "/usr/local/cuda/lib")
                                            if os.path.isdir(p)]
    env["LD_LIBRARY_PATH"] = ":".join(paths + ([env["LD_LIBRARY_PATH"]] if env.get("LD_LIBRARY_PATH") else []))
    logs = a.logs or os.path.join(work, "logs")
    os.makedirs(logs, exist_ok=True)
    faults = manifest["faults"]
    if a.only:
        keep = set(a.only.split(","))
        faults = [x for x in faults if x["id"] in keep]
    runnable = [x for x in faults if x.get("binary")]
    union = ":".join(dict.fromkeys(p for x in runnable for p in x["filter"].split(":")))
    base_bin = os.path.join(work, "bin", "baseline")
    print(f"== {name} (driver {driver}); archive of {manifest['commit']} built {manifest['built']} "
          f"for sm_{manifest['arch']}", flush=True)
    t0 = time.time()
    base, note = run_tests(base_bin, union or "*", env, a.timeout * 3, os.path.join(logs, "baseline.log"), work)
    base_s = time.time() - t0
    if base is None or not any(st != "skipped" for st, _ in base.values()):
        print(f"baseline: {note or 'no test ran'} (log: {os.path.join(logs, 'baseline.log')}); cannot judge the faults")
        if not a.logs:
            print(open(os.path.join(logs, "baseline.log"), errors="replace").read()[-4000:])
        return 2
    bad = sorted(t for t, (st, _) in base.items() if st != "pass")
    print(f"baseline: {len(base) - len(bad)} of {len(base)} tests pass ({base_s:.0f} s)"
          + (f"; not passing, so left out of every mutant's filter: {', '.join(bad)}" if bad else ""), flush=True)
    if note:
        print(f"baseline: {note}")

    rows = []
    for x in faults:
        r = {k: x[k] for k in ("id", "what", "filter", "files", "expect") if k in x}
        r["caught"], r["failing_tests"] = False, []
        if not x.get("binary"):
            r["status"] = x["status"]
            rows.append(r)
            print(f"{x['id']}: {r['status']}", flush=True)
            continue
        binary = os.path.join(work, x["binary"])
        filt = x["filter"] + ("-" + ":".join(bad) if bad else "")
        tests = listed(binary, filt, env)
        excluded = [t for t in listed(binary, x["filter"], env) if t in bad]
        if excluded:
            r["baseline_failing_left_out"] = excluded
        if not tests:
            r["status"] = ("no test left to catch it: " + ", ".join(excluded) + " fail at baseline") if excluded else \
                "its filter matches no test"
            rows.append(r)
            print(f"{x['id']}: {r['status']}", flush=True)
            continue
        expect_s = sum(base.get(t, ("", 10.0))[1] for t in tests)
        limit = min(a.timeout, 30 + 5 * expect_s)
        t0 = time.time()
        cases, note = run_tests(binary, filt, env, limit, os.path.join(logs, f"{x['id']}.log"), work)
        r["seconds"] = round(time.time() - t0, 1)
        failing = sorted(t for t, (st, _) in (cases or {}).items() if st == "fail")
        if note:
            failing.append(f"({note})")
        r["failing_tests"] = failing
        r["caught"] = bool(failing)
        r["status"] = "caught" if failing else "NOT CAUGHT"
        rows.append(r)
        print(f"{x['id']}: {r['status']} ({r['seconds']:.0f} s) {', '.join(failing)[:300]}", flush=True)

    caught = sum(r["caught"] for r in rows)
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    out = {"date": date, "gpu": name, "driver": driver, "commit": manifest["commit"], "arch": manifest["arch"],
           "built": manifest["built"], "target": manifest["target"],
           "what": "each CUDA fault of tools/mutation/faults-gpu.json built into its own test binary and run "
                   "with its gtest filter; caught = a test of the filter fails, crashes or times out",
           "baseline": {"filter": union, "seconds": round(base_s, 1),
                        "passed": sorted(t for t, (st, _) in base.items() if st == "pass"), "not_passing": bad},
           "caught": caught, "faults_total": len(rows), "faults": rows}
    os.makedirs(a.results, exist_ok=True)
    path = os.path.join(a.results, f"mutation-gpu-{date}-{gpu_tag(name)}.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print("\n| fault | what | result | caught by |\n|---|---|---|---|")
    for r in rows:
        by = ", ".join(r["failing_tests"]) if r["caught"] else r["filter"]
        print(f"| `{r['id']}` ({', '.join(r['files'])}) | {r['what']} | {r['status']} | {by} |")
    print(f"\n{caught} of {len(rows)} faults caught; wrote {path}")
    return 0 if caught == len(rows) else 1


# ---------------------------------------------------------------- entry
def main(argv):
    ap = argparse.ArgumentParser(prog="mutate.py --gpu", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--build-only", metavar="OUTDIR", help="build the mutants here and pack them into OUTDIR")
    mode.add_argument("--run", metavar="ARCHIVE", help="run a packed archive on this GPU host")
    mode.add_argument("--check", action="store_true", help="every fault applies once and compiles (no GPU)")
    ap.add_argument("--faults", default=os.path.join(ROOT, "tools/mutation/faults-gpu.json"))
    ap.add_argument("--only", default="", help="comma-separated fault ids")
    ap.add_argument("--scratch", default=os.environ.get("MUTATION_GPU_SCRATCH", "/tmp/tandem-mutation-gpu"))
    ap.add_argument("--arch", default="90a", help="CUDA target of the mutants (TANDEM_CUDA_ARCH; default 90a)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--no-compile", action="store_true", help="--check: search texts only")
    ap.add_argument("--results", default=os.path.join(ROOT, "bench/results"), help="--run: where the JSON goes")
    ap.add_argument("--logs", default="", help="--run: keep each binary's output here")
    ap.add_argument("--timeout", type=float, default=180, help="--run: most seconds per mutant")
    a = ap.parse_args(argv)
    a.scratch = os.path.abspath(a.scratch)
    if a.run:
        return run(a, a.run)
    faults = load_faults(a.faults, a.only)
    if a.check:
        return check(a, faults)
    if a.build_only:
        return build_only(a, faults, os.path.abspath(a.build_only))
    if not gpu_name()[0]:
        print("mutation-gpu: no NVIDIA GPU visible on this machine: build the mutants with "
              "`tools/mutation/mutate.py --gpu --build-only OUTDIR` and run OUTDIR/" + ARCHIVE +
              " with `--gpu --run` on a GPU host")
        return 2
    outdir = os.path.join(a.scratch, "out")
    rc = build_only(a, faults, outdir)
    if rc == 2:
        return rc
    return max(rc, run(a, os.path.join(outdir, ARCHIVE)))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
