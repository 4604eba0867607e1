#!/usr/bin/env python3
"""Mutation check: do the tests catch small deliberate faults?

Applies each fault of faults.json (file, exact search text, replacement, test targets, optional
gtest filter) one at a time to a scratch copy of the working tree, builds only the affected test
targets there (one build directory reused across runs, through ccache), runs them, and prints a
table of which tests fail for each fault. Exits non-zero when a fault is caught by no test, when a
fault's search text no longer occurs exactly once (the list has gone stale), or when the unmutated
tree fails its own tests (a baseline that fails would "catch" everything).

  python3 tools/mutation/mutate.py [--scratch DIR] [--only ID,ID] [--jobs N] [--out FILE.md]

CUDA faults (faults-gpu.json, `make mutation-gpu`) are gpu.py's: `mutate.py --gpu ...` runs it (see
`mutate.py --gpu --help`).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

from common import ROOT, failed_tests, sh, sync_tree


def main():
    if "--gpu" in sys.argv[1:]:
        import gpu
        return gpu.main([x for x in sys.argv[1:] if x != "--gpu"])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--faults", default=os.path.join(ROOT, "tools/mutation/faults.json"))
    ap.add_argument("--scratch", default=os.environ.get("MUTATION_SCRATCH", "/tmp/tandem-mutation"))
    ap.add_argument("--only", default="", help="comma-separated fault ids")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--out", default="", help="also write the table (Markdown) here")
    ap.add_argument("--no-baseline", action="store_true", help="skip the unmutated run")
    a = ap.parse_args()

    with open(a.faults) as f:
        faults = json.load(f)
    if a.only:
        keep = set(a.only.split(","))
        faults = [x for x in faults if x["id"] in keep]
    tree = os.path.join(a.scratch, "tree")
    build = os.path.join(tree, "build")
    os.makedirs(tree, exist_ok=True)
    sync_tree(tree)
    env = dict(os.environ)
    # Paths under the scratch tree hash like the worktree's (relative), so ccache serves its objects.
    env.setdefault("CCACHE_DIR", os.path.expanduser("~/.ccache"))
    env["CCACHE_BASEDIR"] = a.scratch
    if not os.path.exists(os.path.join(build, "build.ninja")):
        launcher = "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache" if shutil.which("ccache") else ""
        rc, out = sh(f"cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DTANDEM_CUDA=OFF {launcher}",
                     cwd=tree, env=env)
        if rc != 0:
            print(out)
            return 2
    build_rel = "build"

    def build_and_run(targets, filt):
        rc, out = sh(f"cmake --build {build_rel} -j{a.jobs} --target {' '.join(targets)}", cwd=tree, env=env)
        if rc != 0:
            return "build failed", [out[-1500:]]
        failed = []
        for t in targets:
            cmd = f"./{t} --gtest_brief=1" + (f" --gtest_filter='{filt}'" if filt else "")
            try:
                rc, out = sh(cmd, cwd=build, env=env, timeout=1800)
            except subprocess.TimeoutExpired:
                failed.append(f"{t}: timed out")
                continue
            names = failed_tests(out)
            if rc != 0 and not names:
                names = [f"{t}: exit {rc} (crash or abort)"]
            failed += names
        return "ok", failed

    problems = 0
    if not a.no_baseline:
        groups = {}
        for x in faults:
            groups.setdefault(tuple(x["targets"]), set()).add(x.get("filter", "*"))
        for targets, filters in groups.items():
            filt = "*" if "*" in filters else ":".join(sorted(filters))
            status, failed = build_and_run(list(targets), filt)
            if status != "ok" or failed:
                print(f"baseline ({' '.join(targets)}) fails before any fault: {status} {failed}")
                return 2
        print(f"baseline: {', '.join(' '.join(t) for t in groups)} pass")

    rows = []
    for x in faults:
        path = os.path.join(tree, x["file"])
        with open(path) as f:
            orig = f.read()
        n = orig.count(x["search"])
        if n != 1:
            rows.append((x, f"stale: search text found {n} times", [], 0.0))
            problems += 1
            continue
        t0 = time.time()
        try:
            with open(path, "w") as f:
                f.write(orig.replace(x["search"], x["replace"]))
            status, failed = build_and_run(x["targets"], x.get("filter", ""))
        finally:
            with open(path, "w") as f:
                f.write(orig)
        dt = time.time() - t0
        if status != "ok":
            problems += 1
        elif not failed:
            status = "NOT CAUGHT"
            problems += 1
        else:
            status = "caught"
        rows.append((x, status, failed, dt))
        print(f"{x['id']}: {status} ({dt:.0f} s) {', '.join(failed)[:300]}", flush=True)

    lines = ["| fault | what | result | caught by |", "|---|---|---|---|"]
    for x, status, failed, dt in rows:
        where = f"{' '.join(x['targets'])}" + (f" --gtest_filter={x['filter']}" if x.get("filter") else "")
        lines.append(f"| `{x['id']}` ({x['file']}) | {x['what']} | {status} | "
                     f"{', '.join(failed) if status == 'caught' else where} |")
    table = "\n".join(lines)
    print()
    print(table)
    if a.out:
        with open(a.out, "w") as f:
            f.write(table + "\n")
    print(f"\n{len(rows) - problems} of {len(rows)} faults caught")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
