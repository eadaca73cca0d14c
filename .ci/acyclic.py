#!/usr/bin/env python3
"""Fails when the modules of a crate, or the C and C++ files of a folder, import
each other in a circle.

usage: .ci/acyclic.py PACKAGE SRC_DIR [--bin NAME] [--features F]...
       .ci/acyclic.py --cpp DIR...

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

The C, C++ and CUDA graph (`--cpp`): each unit one node (`x.cpp` with its `x.h`), an edge
where a unit includes another's header or names what another declares at
namespace scope (a function, type or enum, in its header, or else in its `.cpp`
outside an anonymous namespace and not `static`); a name after `.` or `->` is a
member, never another unit's function. Names the units share (two files each
declaring `load`) are left out, as nothing but the compiler can tell them apart.
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


CPP_INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)
CPP_NOISE = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.S)
CPP_TYPE = re.compile(r"\b(?:struct|class|union|enum(?:\s+class)?)\s+([A-Za-z_]\w*)")
CPP_USING = re.compile(r"\busing\s+([A-Za-z_]\w*)\s*=")
CPP_FUNCTION = re.compile(r"([A-Za-z_]\w*)\s*\(")
CPP_NAME = re.compile(r"(\.|->)?\s*\b([A-Za-z_]\w*)")
CPP_KEYWORDS = {"if", "for", "while", "switch", "return", "sizeof", "alignof", "decltype",
                "static_assert", "defined", "operator", "noexcept", "alignas", "__attribute__",
                "void", "bool", "char", "short", "int", "long", "unsigned", "signed", "float",
                "double", "auto", "const", "volatile"}


def cpp_code(path):
    """A C/C++ file without comments, string and character literals or preprocessor
    lines (line breaks kept)."""
    text = CPP_NOISE.sub(lambda m: "\n" * m.group(0).count("\n") or " ", path.read_text())
    lines, directive = [], False
    for line in text.splitlines():
        directive = directive or line.lstrip().startswith("#")
        lines.append("" if directive else line)
        directive = directive and line.rstrip().endswith("\\")
    return "\n".join(lines)


def cpp_declarations(text):
    """(functions, types) declared at file scope, each a dict name -> whether other
    units see it: those in named namespaces and `extern "C"` blocks, unless `static`;
    not those in anonymous namespaces. Nothing inside function bodies or types."""
    functions, types, scopes, head = {}, {}, [], ""
    for ch in text + ";":
        if ch in "{;":
            if all(s is not None for s in scopes):
                declare(head.strip(), all(scopes), functions, types)
            if ch == "{":
                opens = head.strip()
                named = re.fullmatch(r"(?:inline\s+)?namespace\s+\w+(?:::\w+)*|extern\s*", opens)
                anonymous = re.fullmatch(r"namespace", opens)
                scopes.append(True if named else False if anonymous else None)
            head = ""
        elif ch == "}":
            scopes.pop() if scopes else None
            head = ""
        else:
            head += ch
    return functions, types


def declare(head, visible, functions, types):
    """The name a statement at file scope declares, into `functions` or `types`."""
    if not head or re.match(r"(namespace|extern\s*$|using\s+namespace|template\s*<[^>]*>\s*$)\b", head):
        return
    visible = visible and not re.match(r"(template\s*<[^>]*>\s*)?static\b", head)
    for name in CPP_TYPE.findall(head.split("(")[0]) + CPP_USING.findall(head):
        types[name] = types.get(name, False) or visible
    call = CPP_FUNCTION.search(head)
    if call and "=" not in head[: call.start()] and call.group(1) not in CPP_KEYWORDS:
        functions[call.group(1)] = functions.get(call.group(1), False) or visible


def cpp_graph(dirs):
    """(graph, why) of the C and C++ files under `dirs`, a unit a node: `x.cpp` and
    `x.h` are unit `x`; an edge for an include of another unit's header, a call of a
    function another unit declares (`name(`, not after `.` or `->`) and any use of a
    type it declares, unless the unit declares that name itself."""
    suffixes = (".c", ".cpp", ".h", ".cu", ".cuh")
    files = sorted(p for d in dirs for p in Path(d).rglob("*") if p.suffix in suffixes)
    unit = lambda p: str(p.with_suffix(""))
    texts = {p: cpp_code(p) for p in files}
    declared = {p: cpp_declarations(texts[p]) for p in files}
    functions, types = 0, 1  # the two halves of what cpp_declarations returns
    own, owners = defaultdict(set), {functions: {}, types: {}}
    for kind in (functions, types):
        seen = defaultdict(set)
        for p in files:
            for name, visible in declared[p][kind].items():
                own[unit(p)].add(name)
                if visible:
                    # A name a header declares is its unit's, whoever defines it.
                    seen[name].add((p.suffix not in (".h", ".cuh"), unit(p)))
        # The one unit that declares it (in a header, if any does); none if several.
        for name, units in seen.items():
            in_headers = {u for cpp, u in units if not cpp}
            candidates = in_headers or {u for _, u in units}
            if len(candidates) == 1:
                owners[kind][name] = candidates.pop()
    graph, why = defaultdict(set), defaultdict(set)
    by_name = {p.name: unit(p) for p in files}
    for p in files:
        here = unit(p)
        graph[here]
        edge = lambda there, where: (graph[here].add(there), why[here, there].add(where))
        for number, line in enumerate(p.read_text().splitlines(), 1):
            m = CPP_INCLUDE.match(line)
            there = m and by_name.get(Path(m.group(1)).name)
            if there and there != here:
                edge(there, f"{p}:{number} #include")
        for number, line in enumerate(texts[p].splitlines(), 1):
            for m in CPP_NAME.finditer(line):
                member, name = m.groups()
                call = line[m.end():].lstrip().startswith("(")
                there = owners[types].get(name) or (call and owners[functions].get(name))
                if not member and there and there != here and name not in own[here]:
                    edge(there, f"{p}:{number} {name}")
    return graph, why

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
    if args[0] == "--cpp":
        graph, why = cpp_graph(args[1:])
        report(" ".join(args[1:]), "C/C++ units", graph, why)
        return
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
    report(package, "modules", graph, why)


def report(what, nodes, graph, why):
    """Prints the count of nodes and edges, or each circle and exits 1."""
    groups = circles(graph)
    edges = sum(len(v) for v in graph.values())
    if not groups:
        print(f"{what}: {len(graph)} {nodes}, {edges} imports between them, no circle")
        return
    for group in groups:
        circle = shortest_circle(graph, group)
        print(f"{what}: {nodes} that import each other in a circle: {', '.join(group)}")
        for a, b in zip(circle, circle[1:]):
            print(f"  {a} -> {b}  ({'; '.join(sorted(why[a, b])[:3])})")
    sys.exit(1)


if __name__ == "__main__":
    main()
