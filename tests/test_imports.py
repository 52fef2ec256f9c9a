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


MUTATORS = {
    "append",
    "extend",
    "update",
    "add",
    "pop",
    "popitem",
    "clear",
    "setdefault",
    "insert",
    "remove",
    "discard",
    "sort",
    "reverse",
    "appendleft",
}


def shared_state(package: Path) -> list[str]:
    """The module-level names of `package`'s modules that some code changes after import (`global` rebinding, item
    or attribute assignment, a mutating method such as append) and that another module of the package reads (`from
    .m import NAME` or `m.NAME`) or that are public (no leading underscore: a module's functions hand it to their
    callers, as target.ACTIVE once reached the Meter through target.after_step): state that reaches a module
    without being passed to it. "module.NAME (read by ...)" for each. A private one that only its module's functions
    use (checkpoint._HELD, the folder locks this process holds) is the module's own."""
    trees = {path.stem: ast.parse(path.read_text()) for path in sorted(package.glob("*.py"))}
    names = {m: {t.id for node in tree.body if isinstance(node, (ast.Assign, ast.AnnAssign))
                 for t in (node.targets if isinstance(node, ast.Assign) else [node.target]) if isinstance(t, ast.Name)}
             for m, tree in trees.items()}  # fmt: skip
    imported = {m: {} for m in trees}  # module -> {local name: (owner module, name)}
    reads = {}  # (owner, name) -> modules that read it
    for m, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module in trees:
                for alias in node.names:
                    imported[m][alias.asname or alias.name] = (node.module, alias.name)
                    reads.setdefault((node.module, alias.name), set()).add(m)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in trees:
                if node.value.id != m and node.attr in names[node.value.id]:
                    reads.setdefault((node.value.id, node.attr), set()).add(m)
    changed = set()

    def owner(m: str, expr) -> tuple[str, str] | None:
        while isinstance(expr, ast.Subscript) or (  # RUN["w"].append, STATE.inner.x: the name at the root
            isinstance(expr, ast.Attribute) and not (isinstance(expr.value, ast.Name) and expr.value.id in trees)
        ):
            expr = expr.value
        if isinstance(expr, ast.Name):
            return imported[m].get(expr.id) or ((m, expr.id) if expr.id in names[m] else None)
        if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name) and expr.value.id in trees:
            return (expr.value.id, expr.attr)
        return None

    for m, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Global):
                changed.update((m, name) for name in node.names)
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, (ast.AugAssign, ast.AnnAssign)) else []  # fmt: skip
            if isinstance(node, ast.Delete):
                targets = node.targets
            for target in targets:
                if (
                    isinstance(target, ast.Attribute)
                    and isinstance(target.value, ast.Name)
                    and target.value.id in trees
                ):
                    changed.add((target.value.id, target.attr))  # another module's global rebound: a.ACTIVE = x
                elif isinstance(target, (ast.Subscript, ast.Attribute)) and (found := owner(m, target.value)):
                    changed.add(found)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS:
                if found := owner(m, node.func.value):
                    changed.add(found)
    shared = [(o, n) for o, n in changed if reads.get((o, n)) or not n.startswith("_")]  # public: meant for others
    return sorted(f"{o}.{n} (read by {', '.join(sorted(reads.get((o, n), ()))) or 'its functions'})" for o, n in shared)


def test_no_module_level_state_is_read_across_src_common(tmp_path):
    """Nothing a run changes lives in a module of src/common/ for another module to read: the probe of --target-loss,
    the run's checkpoint and signal record (RunState) and the like are passed as arguments. The check finds a
    shared list appended to in one module and read in another, a `global` rebound and imported, and a public global
    that only its own functions read (before 2026-11-29: runstate.RUN, target.ACTIVE, models.WATCHERS)."""
    assert shared_state(REPO / "src" / "common") == []
    (tmp_path / "a.py").write_text("SEEN = []\nFLAG = None\n\ndef f():\n    global FLAG\n    FLAG = 1\n")
    (tmp_path / "b.py").write_text(
        "from .a import SEEN\nfrom . import a\n\ndef g(x):\n    SEEN.append(x)\n    return a.FLAG\n"
    )
    assert shared_state(tmp_path) == ["a.FLAG (read by b)", "a.SEEN (read by b)"]
    (tmp_path / "c.py").write_text(
        "ACTIVE = None\n_MINE = {}\n\ndef on(x):\n    global ACTIVE\n    ACTIVE = x\n    _MINE[x] = 1\n"
    )
    assert shared_state(tmp_path) == ["a.FLAG (read by b)", "a.SEEN (read by b)", "c.ACTIVE (read by its functions)"]
    (tmp_path / "d.py").write_text(
        "from . import a\nfrom .c import _MINE\n\ndef h(x):\n    a.FLAG = x\n    _MINE['k'].append(x)\n"
    )
    assert shared_state(tmp_path)[-1] == "c._MINE (read by d)"  # another's global rebound, a list inside a dict
