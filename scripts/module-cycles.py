#!/usr/bin/env python3
"""Fails when the top-level modules of a workspace crate import each other in a cycle.

For each crate of the workspace (the members of the root Cargo.toml), builds the graph of
references between its top-level modules: module `a` (src/a.rs and everything under src/a/)
points at module `b` when one of its files names `crate::b` (in a `use crate::b...`, a
`use crate::{b, ...}` group or a `crate::b::` path), or `super::b` in a top-level file
(src/a.rs). Test-only files (`tests.rs`, `*_tests.rs`, `tests/` below
a module) and the body of a trailing `#[cfg(test)] mod tests { ... }` are left out: tests may
reach anywhere. Every strongly connected component of more than one module is a cycle; they
are listed with one reference of each edge (file:line) and the exit status is 1.

  python3 scripts/module-cycles.py            # every workspace crate
  python3 scripts/module-cycles.py copier     # some crates (directory names)

Standard library only; reads files as text (no macro expansion, no cfg evaluation).
"""

import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Cycles that are known and owned elsewhere: a cycle is reported but does not fail when it
# goes through one of these modules of that crate. copier's `engine` and `mysql` are being
# moved into a crate of their own (issue #19), which ends their cycles with the rest.
ALLOWED = {"copier": {"engine", "mysql"}}

USE_CRATE = re.compile(r"\bcrate::([a-z_][a-z0-9_]*)")
USE_SUPER = re.compile(r"(?<![:\w])super::([a-z_][a-z0-9_]*)")
USE_GROUP = re.compile(r"\buse\s+crate::\{")
CFG_TEST_MOD = re.compile(r"#\[cfg\(test\)\]\s*(?:#\[[^\]]*\]\s*)*(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+\s*\{")
LINE_COMMENT = re.compile(r"//.*")


def members():
    text = open(os.path.join(ROOT, "Cargo.toml"), encoding="utf-8").read()
    m = re.search(r"members\s*=\s*\[([^\]]*)\]", text)
    return re.findall(r'"([^"]+)"', m.group(1)) if m else []


def is_test_file(rel):
    parts = rel.split(os.sep)
    name = parts[-1]
    return (
        name == "tests.rs"
        or name.endswith("_tests.rs")
        or "tests" in parts[:-1]
        or name.startswith("test_")
    )


def strip_test_mods(text):
    """Blanks the bodies of `#[cfg(test)] mod x { ... }` (keeping line numbers)."""
    out = list(text)
    for m in CFG_TEST_MOD.finditer(text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            c = text[i]
            if c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
            if c != "\n":
                out[i] = " "
            i += 1
    return "".join(out)


def group_names(text, start):
    """The first path segment of each item of a `use crate::{...}` group (`start`: after `{`)."""
    depth, i, items, cur = 1, start, [], ""
    while i < len(text) and depth:
        c = text[i]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        if depth == 1 and c == ",":
            items.append(cur)
            cur = ""
        elif depth >= 1:
            cur += c
        i += 1
    items.append(cur)
    names = []
    for item in items:
        m = re.match(r"\s*([a-z_][a-z0-9_]*)", item)
        if m:
            names.append(m.group(1))
    return names


def crate_graph(crate):
    src = os.path.join(ROOT, crate, "src")
    modules = set()
    for name in os.listdir(src):
        path = os.path.join(src, name)
        if name.endswith(".rs") and name not in ("lib.rs", "main.rs"):
            modules.add(name[:-3])
        elif os.path.isdir(path) and name != "bin":
            modules.add(name)
    edges = {}  # (a, b) -> "file:line"
    for dirpath, _, files in os.walk(src):
        for f in sorted(files):
            if not f.endswith(".rs"):
                continue
            path = os.path.join(dirpath, f)
            rel = os.path.relpath(path, src)
            if is_test_file(rel):
                continue
            first = rel.split(os.sep)[0]
            owner = first[:-3] if first.endswith(".rs") else first
            if owner not in modules:
                continue  # lib.rs, main.rs, src/bin: the crate root may name anything
            text = open(path, encoding="utf-8").read()
            text = strip_test_mods(text)
            lines = [LINE_COMMENT.sub("", line) for line in text.split("\n")]
            text = "\n".join(lines)
            refs = [(m.start(), m.group(1)) for m in USE_CRATE.finditer(text)]
            if os.sep not in rel and f != "mod.rs":
                refs += [(m.start(), m.group(1)) for m in USE_SUPER.finditer(text)]
            for m in USE_GROUP.finditer(text):
                refs += [(m.end(), n) for n in group_names(text, m.end())]
            for pos, target in refs:
                if target == owner or target not in modules:
                    continue
                line = text.count("\n", 0, pos) + 1
                where = f"{crate}/src/{rel}:{line}"
                edges.setdefault((owner, target), where)
    return modules, edges


def cycles(modules, edges):
    """Strongly connected components of more than one module (Tarjan)."""
    succ = {m: sorted(b for (a, b) in edges if a == m) for m in modules}
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in succ[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for m in sorted(modules):
        if m not in index:
            visit(m)
    return out


def main(argv):
    crates = argv[1:] or members()
    failed = 0
    for crate in crates:
        if not os.path.isdir(os.path.join(ROOT, crate, "src")):
            continue
        modules, edges = crate_graph(crate)
        found = cycles(modules, edges)
        allowed = ALLOWED.get(crate, set())
        summary = f"{crate}: {len(modules)} top-level modules, {len(edges)} edges"
        if not found:
            print(f"{summary}, no cycle")
            continue
        print(f"{summary}, {len(found)} cycle(s)")
        for comp in found:
            known = bool(allowed & set(comp))
            tag = "known (allowed)" if known else "CYCLE"
            failed += 0 if known else 1
            print(f"{crate}: {tag}: {' <-> '.join(comp)}")
            inside = set(comp)
            for (a, b), where in sorted(edges.items()):
                if a in inside and b in inside:
                    print(f"    {a} -> {b}  ({where})")
    if failed:
        print(f"module-cycles: {failed} cycle(s) between top-level modules", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
