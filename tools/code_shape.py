#!/usr/bin/env python3
"""tools/code_shape.py: the shape figures issue 23 sets targets on, measured one way (universal-ctags).

Prints, for the C++ sources under memd/, workerd/, common/ and tools/ (or the folders given):
  - lines per file for the files named by --files (default: workerd/worker.cc, memd/residency_manager.cc);
  - the methods of the classes named by --classes (default: dhs::Worker, dhs::ResidencyManager), counted as the
    distinct member-function names declared in the class (prototypes and inline definitions; constructors,
    destructors and operators included, overloads counted once);
  - the fields of the structs named by --structs (default: dhs::WorkerRequest, the worker's request since issue 23's
    split: workerd/worker_request.h; Worker::Request is its alias);
  - every function definition longer than --over lines (default 80), longest first, and how many are over 100:
    C++ (and CUDA) functions by universal-ctags, Python functions of the same folders by the ast module.

A function's length is `end - line + 1`: from its signature's first line to its closing brace (ctags' end), or to
its last statement (Python's end_lineno).
Usage: python3 tools/code_shape.py [--over 80] [folders...]
Needs universal-ctags (Debian package universal-ctags, installed by tools/setup.sh).
"""
import argparse
import ast
import collections
import glob
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tags(paths):
    out = subprocess.run(["ctags", "--output-format=json", "--fields=+neKSZs", "--kinds-c++=+p", "-R", "-f", "-",
                          "--languages=C++", "--map-C++=+.cu", "--map-C++=+.cuh", *paths],
                         cwd=ROOT, check=True, capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def python_functions(folders):
    """(lines, path, line, name) of every Python function under `folders`."""
    found = []
    for folder in folders:
        for path in sorted(glob.glob(os.path.join(ROOT, folder, "**", "*.py"), recursive=True)):
            rel = os.path.relpath(path, ROOT)
            for node in ast.walk(ast.parse(open(path).read(), rel)):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    found.append((node.end_lineno - node.lineno + 1, rel, node.lineno, node.name))
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folders", nargs="*", default=["memd", "workerd", "common", "tools"])
    ap.add_argument("--over", type=int, default=80)
    ap.add_argument("--files", nargs="*", default=["workerd/worker.cc", "memd/residency_manager.cc"])
    ap.add_argument("--classes", nargs="*", default=["dhs::Worker", "dhs::memd::ResidencyManager"])
    ap.add_argument("--structs", nargs="*", default=["dhs::WorkerRequest"])
    args = ap.parse_args()

    for f in args.files:
        path = os.path.join(ROOT, f)
        n = sum(1 for _ in open(path)) if os.path.exists(path) else 0
        print(f"lines {f}: {n}")
    all_tags = tags(args.folders)
    methods = collections.defaultdict(set)
    fields = collections.defaultdict(int)
    for t in all_tags:
        scope = t.get("scope")
        if t["kind"] in ("prototype", "function") and scope:
            methods[scope].add(t["name"])
        if t["kind"] == "member" and scope:
            fields[scope] += 1
    for c in args.classes:
        print(f"methods {c}: {len(methods.get(c, ()))}")
    for s in args.structs:
        print(f"fields {s}: {fields.get(s, 0)}")
    funcs = [(t["end"] - t["line"] + 1, t["path"], t["line"], (t.get("scope", "") + "::" + t["name"]).lstrip(":"))
             for t in all_tags if t["kind"] == "function" and "end" in t and not t["path"].startswith("tests/")]
    funcs += python_functions(args.folders)
    funcs.sort(reverse=True)
    over = [f for f in funcs if f[0] > args.over]
    print(f"functions over {args.over} lines: {len(over)}; over 100: {sum(1 for f in funcs if f[0] > 100)}")
    for n, path, line, name in over:
        print(f"  {n:4d}  {path}:{line}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
