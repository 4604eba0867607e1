"""Helpers shared by the mutation check's CPU mode (mutate.py) and CUDA mode (gpu.py): running a
command, copying the working tree into a scratch tree, reading gtest's failed tests."""
import os
import re
import shutil
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def sh(cmd, cwd, env=None, timeout=None):
    p = subprocess.run(cmd, cwd=cwd, env=env, shell=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, errors="replace", timeout=timeout)
    return p.returncode, p.stdout


def sync_tree(scratch, prune=False):
    """Copies tracked and untracked-but-not-ignored files into scratch. A file whose content differs is
    written with a fresh mtime, so the build sees it as changed even when the scratch copy's object
    was built from a mutated version (mtimes copied from the worktree could be older than that
    object and leave the fault compiled in). prune: also deletes the scratch files the worktree no
    longer has (outside the top-level build*/ directories), which the build's globs would pick up."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                           stdout=subprocess.PIPE).stdout.decode().split("\0")
    if prune:
        keep = set(files)
        for d, dirs, names in os.walk(scratch):
            rel = os.path.relpath(d, scratch)
            if rel == ".":
                dirs[:] = [x for x in dirs if not x.startswith("build")]
            for n in names:
                f = os.path.normpath(os.path.join(rel, n))
                if f not in keep:
                    os.remove(os.path.join(d, n))
    for f in files:
        if not f or not os.path.isfile(os.path.join(ROOT, f)):
            continue
        src, dst = os.path.join(ROOT, f), os.path.join(scratch, f)
        with open(src, "rb") as fh:
            data = fh.read()
        if os.path.exists(dst):
            with open(dst, "rb") as fh:
                if fh.read() == data:
                    continue
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        with open(dst, "wb") as fh:
            fh.write(data)
        shutil.copymode(src, dst)


def failed_tests(output):
    names = sorted(set(re.findall(r"^\[  FAILED  \] ([\w/.]+)(?: \(| ,|$)", output, re.M)))
    return [n for n in names if "." in n]
