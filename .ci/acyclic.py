#!/usr/bin/env python3
"""Fails when the modules of a crate import each other in a circle.

usage: .ci/acyclic.py PACKAGE SRC_DIR [--bin NAME] [--features F]...

The graph is the union of two readings of the crate, each module one node (a
file, or an inline `mod`; an item counts as its module's):
- `cargo modules dependencies` (rust-analyzer's name resolution: every `use`,
  re-exports resolved to where the item is defined), once per feature set given
  (none, then each `--features`);
- every `crate::…` and `super::…` path written in code (outside comments and the
  `#[cfg(test)] mod tests` at the end of a file), resolved to the longest module it
  names — the paths used inline, which `cargo modules` does not report.
A parent module is not exempt: a `mod.rs` that its children import from may not
import (or re-export) them back. Exit status 1 and one circle per group of
modules that reach each other, edge by edge, with where each edge comes from.
"""

import re
import subprocess
import sys
from collections import defaultdict, deque
from pathlib import Path

EDGE = re.compile(r'^\s*"([^"]+)" -> "([^"]+)" \[label="uses"')
PATH = re.compile(r"\b(crate|super)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")


def cargo_modules_edges(package, target, features):
    """`uses` edges between modules, from `cargo modules dependencies`."""
    cmd = [
        "cargo", "modules", "dependencies", "--package", package, *target,
        "--no-externs", "--no-sysroot", "--no-fns", "--no-types", "--no-traits",
        "--no-owns",
    ]
    if features:
        cmd += ["--features", features]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return [m.groups() for m in map(EDGE.match, out.splitlines()) if m]


def module_of(src, path, crate):
    """`crate::a::b` for `src/a/b.rs` or `src/a/b/mod.rs`."""
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] in ("lib", "main", "mod"):
        parts.pop()
    return "::".join([crate] + parts)


def code(path):
    """A file's code with line breaks kept: no comments, no trailing test module."""
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
        if line.strip() == "#[cfg(test)]" and lines[i + 1 : i + 2] and lines[i + 1].startswith("mod tests"):
            lines = lines[:i]
            break
    return "\n".join(line.split("//", 1)[0] for line in lines)


USE = re.compile(r"\b(pub(?:\([^)]*\))?\s+)?use\s+([^;]+);", re.S)


def use_paths(tree):
    """The paths of a use tree: `a::{b, c::{d, e as f}}` -> a::b, a::c::d, a::c::e."""
    tree = re.sub(r"\s+", "", re.sub(r"\s+as\s+\w+", "", tree))
    if "{" not in tree:
        return [tree]
    prefix, inner = tree.split("{", 1)
    inner = inner[: inner.rindex("}")]
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(inner + ","):
        if ch in "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        elif ch == "," and depth == 0:
            if inner[start:i]:
                parts.append(inner[start:i])
            start = i + 1
    return [p for part in parts for p in use_paths(prefix + part)]


def absolute(here, path, crate):
    """`crate::a::b`, `super::b` or `b` (a child) written in module `here`, as names."""
    names = path.split("::")
    if names[0] == "crate":
        return [crate] + names[1:]
    base = here.split("::")
    if names[0] == "self":
        names = names[1:]
    while names and names[0] == "super":
        base, names = base[:-1], names[1:]
    return base + names


def path_edges(src, crate, modules):
    """(from, to, where) for every `crate::`/`super::` path written outside `use`."""
    files = {module_of(src, p, crate): p for p in sorted(src.rglob("*.rs"))}
    texts = {m: code(p) for m, p in files.items()}
    # `pub use` re-exports: (module, name) -> the path it stands for.
    reexports = {}
    for here, text in texts.items():
        for m in USE.finditer(text):
            if m.group(1):
                for path in use_paths(m.group(2)):
                    reexports[here, path.split("::")[-1]] = absolute(here, path, crate)

    def resolve(names, seen=0):
        for k in range(len(names), 0, -1):
            module = "::".join(names[:k])
            if module in modules:
                rest = names[k:]
                if rest and (module, rest[0]) in reexports and seen < 8:
                    return resolve(reexports[module, rest[0]] + rest[1:], seen + 1)
                return module
        return None

    for here, text in texts.items():
        text = USE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
        for number, line in enumerate(text.splitlines(), 1):
            for root, rest in PATH.findall(line):
                target = resolve(absolute(here, root + rest, crate))
                if target and target != here:
                    yield here, target, f"{files[here]}:{number}"


def circles(graph):
    """Groups of nodes that reach each other (Tarjan), each with more than one node."""
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    sys.setrecursionlimit(10_000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return groups


def shortest_circle(graph, group):
    """One shortest circle through the group's first node."""
    start, members = group[0], set(group)
    previous, queue = {start: None}, deque([start])
    while queue:
        v = queue.popleft()
        for w in sorted(graph[v]):
            if w == start:
                circle = [v]
                while previous[circle[-1]] is not None:
                    circle.append(previous[circle[-1]])
                return circle[::-1] + [start]
            if w in members and w not in previous:
                previous[w] = v
                queue.append(w)
    return group


def main():
    args = sys.argv[1:]
    if len(args) < 2:
        sys.exit(__doc__)
    package, src = args[0], Path(args[1])
    option = lambda name: [args[i + 1] for i, a in enumerate(args) if a == name]
    target = ["--bin", *option("--bin")] if option("--bin") else ["--lib"]
    feature_sets = [""] + option("--features")
    graph, why = defaultdict(set), defaultdict(set)
    readings = [(f, cargo_modules_edges(package, target, f)) for f in feature_sets]
    # The crate's name as the compiler knows it (a `[lib] name`, a binary's name).
    crate = next((a.split("::")[0] for _, edges in readings for a, _ in edges), package)
    crate = crate.replace("-", "_")
    modules = {crate}
    for features, edges in readings:
        for a, b in edges:
            modules.update((a, b))
            if a != b:
                graph[a].add(b)
                why[a, b].add("cargo modules" + (f" --features {features}" if features else ""))
    modules.update(module_of(src, p, crate) for p in src.rglob("*.rs"))
    for a, b, where in path_edges(src, crate, modules):
        graph[a].add(b)
        why[a, b].add(where)
    for m in modules:
        graph[m]
    groups = circles(graph)
    edges = sum(len(v) for v in graph.values())
    if not groups:
        print(f"{package}: {len(modules)} modules, {edges} imports between them, no circle")
        return
    for group in groups:
        circle = shortest_circle(graph, group)
        print(f"{package}: modules that import each other in a circle: {', '.join(group)}")
        for a, b in zip(circle, circle[1:]):
            print(f"  {a} -> {b}  ({'; '.join(sorted(why[a, b])[:3])})")
    sys.exit(1)


if __name__ == "__main__":
    main()
