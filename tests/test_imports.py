"""No import circle: in src/common/ (its modules import each other as `from .x import ...` or `from . import x`) and in
bench/ (its modules, in bench/ and its folders, import each other by bare name: `import pairs`, `from cells import
...`), every import counted, those inside a function too (a lazy import hides a circle, it does not cut it). And
src/common/__init__.py's map says what each module imports from the package, as the modules do."""

import ast
import re
from pathlib import Path

from conftest import REPO

COMMON = REPO / "src" / "common"
BENCH = REPO / "bench"


def common_graph(folder: Path = COMMON) -> dict[str, set[str]]:
    """Each module of the package in `folder` (not __init__) and the modules of the package it imports."""
    modules = {p.stem for p in folder.glob("*.py")} - {"__init__"}
    graph = {}
    for name in sorted(modules):
        found = set()
        for node in ast.walk(ast.parse((folder / f"{name}.py").read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                if node.module:  # from .x import y
                    found.add(node.module.split(".")[0])
                else:  # from . import x, y
                    found.update(alias.name for alias in node.names)
        graph[name] = found & modules
    return graph


def bench_graph(folder: Path = BENCH) -> dict[str, set[str]]:
    """Each module under `folder` (any depth) and the others it imports by bare name."""
    paths = {p.stem: p for p in sorted(folder.rglob("*.py"))}
    graph = {}
    for name, path in paths.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
        graph[name] = (found & set(paths)) - {name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One path per circle found by a depth-first walk, as [a, b, ..., a]."""
    found, state, stack = [], {}, []

    def visit(node: str) -> None:
        state[node] = "open"
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == "open":
                found.append(stack[stack.index(target) :] + [target])
            elif target not in state:
                visit(target)
        state[node] = "done"
        stack.pop()

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return found


def test_the_check_finds_a_circle_and_a_lazy_import_does_not_hide_one(tmp_path):
    """The circle src/common/ had (errors <-> images, errors importing BadImage inside its excepthook) is found."""
    (tmp_path / "errors.py").write_text("def hook():\n    from .images import BadImage\n")
    (tmp_path / "images.py").write_text("from .errors import die, first_line\n")
    (tmp_path / "io.py").write_text("import os\n")
    assert cycles(common_graph(tmp_path)) == [["errors", "images", "errors"]]
    (tmp_path / "a.py").write_text("import b\n")
    (tmp_path / "b.py").write_text("def f():\n    from c import g\n")
    (tmp_path / "c.py").write_text("import a, os\n")
    assert cycles({k: v for k, v in bench_graph(tmp_path).items() if k in "abc"}) == [["a", "b", "c", "a"]]


def test_no_import_circle_in_src_common():
    found = cycles(common_graph())
    assert not found, "\n".join(" -> ".join(c) for c in found)


def test_no_import_circle_in_bench():
    found = cycles(bench_graph())
    assert not found, "\n".join(" -> ".join(c) for c in found)


def documented_imports(init: Path = COMMON / "__init__.py") -> dict[str, set[str]]:
    """The map in src/common/__init__.py's docstring: each module and the names in its [brackets] (the brackets of an
    entry start in one column and may run over its next lines)."""
    doc = ast.get_docstring(ast.parse(init.read_text()), clean=False)
    block = doc.split("The map:", 1)[1].split("\n\n", 2)[1]  # the indented entries, up to the next blank line
    entries: dict[str, list[str]] = {}
    for line in block.splitlines():
        entry = re.match(r"    (\w+)\s", line)
        if entry:
            name = entry.group(1)
            entries[name] = []
        entries[name].append(line)
    documented = {}
    for name, lines in entries.items():
        first = next(k for k, line in enumerate(lines) if "[" in line)
        column = lines[first].index("[")
        text = "".join(line[column:] for line in lines[first:])
        documented[name] = set(re.findall(r"\w+", text[1 : text.index("]")]))
    return documented


def test_the_package_s_map_lists_every_module_and_what_it_imports():
    graph = common_graph()
    documented = documented_imports()
    assert set(documented) == set(graph), f"the map misses {set(graph) - set(documented)} or names no module"
    wrong = {name: (sorted(documented[name]), sorted(graph[name])) for name in graph if documented[name] != graph[name]}
    assert not wrong, f"the map says, the module imports: {wrong}"
