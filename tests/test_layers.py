"""The house's floors: a module imports only from its own floor or below, and no packages import in a cycle.

Every import is read from the source with ``ast`` -- the lazy ones inside functions
too, which is where cycles used to hide. ``from netmorph.pkg import sub`` counts as
an import of the module ``netmorph.pkg.sub`` when that module exists.
"""

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "netmorph"

# floors from the ground up (../shared/DESIGN.md); a room on floor k imports floors <= k only
FLOORS = {
    "errors": 0,
    "units": 0,
    "version": 0,
    "files": 0,
    "schedule": 1,
    "collectives": 2,
    "cost": 3,
    "runtime": 4,
    "mesh": 5,
    "models": 6,
    "checkpoint": 6,
    "parallel": 7,
    "moe": 8,
    "elastic": 8,
    "serving": 8,
    "consistency": 8,
    "planner": 8,
    "failures": 8,
    "calibrate": 8,
    "simulate": 9,
    "morph": 10,
    "tour": 11,
    "report": 12,
    "cli": 13,
}
FACADE = ("__init__", "__main__")  # netmorph/__init__.py re-exports; nothing inside imports it


def _modules():
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        yield ".".join(parts), path


MODULES = dict(_modules())


def _resolve(name: str) -> str:
    return name if name in MODULES else name.rsplit(".", 1)[0] if name.rsplit(".", 1)[0] in MODULES else name


def _imports(module: str, path: Path):
    """Every netmorph module ``module`` imports, anywhere in its body."""
    is_pkg = path.name == "__init__.py"
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] == "netmorph"}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = module.split(".") if is_pkg else module.split(".")[:-1]
                pkg = pkg[: len(pkg) - node.level + 1]
                base = ".".join(pkg + ([base] if base else []))
            if base.split(".")[0] != "netmorph":
                continue
            for a in node.names:
                sub = f"{base}.{a.name}"
                out.add(sub if sub in MODULES else base)
    return {_resolve(n) for n in out}


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _floor(module: str) -> int:
    room = _room(module)
    if module == "netmorph" or room == "__main__":
        return max(FLOORS.values()) + 1
    return FLOORS[room]


GRAPH = {m: _imports(m, p) for m, p in MODULES.items()}


def test_every_room_has_a_floor():
    rooms = {_room(m) for m in MODULES} - set(FACADE)
    assert rooms <= set(FLOORS), f"add {sorted(rooms - set(FLOORS))} to FLOORS here and to DESIGN.md's map"


def test_the_reader_sees_lazy_imports_and_packages():
    """The checker itself: it finds an import inside a function and resolves ``from pkg import sub``."""
    assert "netmorph.runtime.launch" in GRAPH["netmorph.consistency.runner"]  # imported inside run()
    assert "netmorph.collectives.base" in GRAPH["netmorph.collectives.allgather"]
    assert "netmorph.schedule" in GRAPH["netmorph.collectives"]


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_only_its_floor_or_below(module):
    me = _floor(module)
    up = [dep for dep in GRAPH[module] if dep == "netmorph" or _floor(dep) > me]
    assert not up, f"{module} (floor {me}) imports from above: {sorted(up)}"


def _cycle(graph):
    """One cycle of ``graph`` as a list of nodes, or None (iterative DFS, three colours)."""
    color, parent = {}, {}
    for start in graph:
        if start in color:
            continue
        stack = [(start, iter(sorted(graph[start])))]
        color[start] = 1
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                color[node] = 2
                stack.pop()
            elif color.get(nxt) == 1:
                cyc = [nxt] + [n for n, _ in stack[[n for n, _ in stack].index(nxt) + 1 :]]
                return cyc + [nxt]
            elif nxt not in color and nxt in graph:
                color[nxt] = 1
                parent[nxt] = node
                stack.append((nxt, iter(sorted(graph[nxt]))))
    return None


def test_no_cycle_between_packages():
    rooms = {}
    for m, deps in GRAPH.items():
        rooms.setdefault(_room(m), set()).update(_room(d) for d in deps if _room(d) != _room(m))
    assert _cycle(rooms) is None, " -> ".join(_cycle(rooms))


def test_no_cycle_between_modules():
    # a package's __init__ re-exporting its own modules is not a cycle with them
    graph = {m: {d for d in deps if not m.startswith(d + ".")} for m, deps in GRAPH.items()}
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))


def test_cycle_finder_finds_one():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_schedule_imports_only_numpy_and_itself():
    third_party = set()
    for m, path in MODULES.items():
        if _room(m) != "schedule":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module]
                if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )
            third_party |= {n.split(".")[0] for n in names}
    assert third_party - set(sys.stdlib_module_names) <= {"numpy", "netmorph"}, third_party


def test_every_package_is_a_regular_package():
    """setuptools' find_packages skips a folder without __init__.py: a wheel would ship without it."""
    missing = [
        str(d.relative_to(ROOT.parent))
        for d in sorted(ROOT.rglob("*"))
        if d.is_dir() and d.name != "__pycache__" and any(d.glob("*.py")) and not (d / "__init__.py").exists()
    ]
    assert missing == []


def test_the_report_only_draws():
    """report/ builds figures and pages from results: it imports the tour's result types and the house's
    files and units, never a package that launches ranks or computes what it shows (netmorph.tour does)."""
    allowed = {"netmorph.files", "netmorph.units", "netmorph.errors"}
    for module, deps in GRAPH.items():
        if _room(module) != "report":
            continue
        wrong = {d for d in deps if d not in allowed and _room(d) not in ("report", "tour")}
        assert not wrong, f"{module} imports {sorted(wrong)}: run it in netmorph.tour, pass the result in"


# what a function may import where it is used: torch and what imports it (netmorph's own modules, so that
# `netmorph --help` and the one-line "install torch" stay fast and clean), the plotting stack, and the extras
DEFERRABLE = {"torch", "matplotlib", "rich", "netmorph", "sklearn", "ml_dtypes", "transformers"}


def test_library_imports_are_at_the_top_of_the_file():
    hidden = []
    for module, path in MODULES.items():
        for fn in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and not node.level:
                    names = [node.module]
                else:
                    continue
                hidden += [f"{path.name}:{node.lineno} {n}" for n in names if n.split(".")[0] not in DEFERRABLE]
    assert not hidden, f"move these imports to the top of their files: {hidden}"


def test_no_module_is_over_400_lines():
    """A file that grows past 400 lines is doing two jobs: split it (the vocabulary issue's rule)."""
    long = {
        str(p.relative_to(ROOT.parent)): n
        for p in sorted(ROOT.rglob("*.py"))
        if (n := len(p.read_text().splitlines())) > 400
    }
    assert not long, long
