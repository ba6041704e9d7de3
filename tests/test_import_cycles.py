"""The import graph of ``companion/`` has no cycle, and the loader of a pair imports no trainer (issue 31).

The graph is read from the source (``ast``), not from a running interpreter, so it holds every
import a module can make: the ones at the top and the ones inside functions. A function-level
("lazy") import counts: two modules that import each other, even lazily, depend on each other, and
a refactor that hoists one import to the top makes the cycle fail at import time. Imports under
``if TYPE_CHECKING:`` count too: they never run, but a module that needs another's types while that
one imports it is the same two-way dependency (issue 31 names such a pair as a cycle).

An edge ``a -> b`` means: running ``a`` may execute ``b``'s module body. ``from pkg import name``
is an edge to ``pkg.name`` when that is a module of the package, else to ``pkg`` (its
``__init__``); importing ``a.b.c`` executes the packages ``a`` and ``a.b`` too, but a package's
``__init__`` that is already being imported by its own submodule is the normal layout of a
package, not a cycle, so those implicit parent edges are not drawn.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "companion"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def import_graph() -> dict[str, set[str]]:
    """``{module: modules of companion it imports}``, top-level and function-level imports alike."""
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        is_package = path.name == "__init__.py"
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:  # relative: from the package of this module
                    base = name.split(".") if is_package else name.split(".")[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    stem = ".".join(base + ([node.module] if node.module else []))
                else:
                    stem = node.module or ""
                targets = [f"{stem}.{a.name}" if f"{stem}.{a.name}" in modules else stem for a in node.names]
            for target in targets:
                # `import a.b.c` where only a.b is ours (a data file, a missing module): the longest known prefix
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component with more than one module (a cycle, or several sharing modules),
    each listed as one cycle through it found by a search, so the message shows the path to cut."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    counter = [0]

    def strongconnect(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            strongconnect(v)
    cycles = []
    for component in components:
        members = set(component)
        start = component[0]
        # shortest path back to start inside the component (breadth first)
        previous: dict[str, str] = {}
        frontier = [start]
        found = None
        while frontier and found is None:
            nxt = []
            for v in frontier:
                for w in sorted(graph[v] & members):
                    if w == start:
                        found = v
                        break
                    if w not in previous:
                        previous[w] = v
                        nxt.append(w)
                if found is not None:
                    break
            frontier = nxt
        path = [found]
        while path[-1] != start:
            path.append(previous[path[-1]])
        cycles.append(path[::-1] + [start] + ([f"(component of {len(component)}: {', '.join(component)})"]
                                               if len(component) > len(path) else []))
    return cycles


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        v = todo.pop()
        for w in graph.get(v, ()):
            if w not in seen:
                seen.add(w)
                todo.append(w)
    return seen


def test_the_graph_reader_sees_top_level_and_lazy_imports() -> None:
    """The reader itself, on edges known to exist: a top-level one and a function-level one."""
    graph = import_graph()
    assert "companion.models.distill.config" in graph["companion.models.distill.train"]  # top of distill/train.py
    assert "companion.models.loading" in graph["companion.models.tiny_pair.report"]  # inside pair_report()
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


def test_companion_has_no_import_cycle() -> None:
    cycles = find_cycles(import_graph())
    assert not cycles, f"{len(cycles)} import cycle(s) in companion/: " + "; ".join(" -> ".join(c) for c in cycles)


LOADERS = ("companion.models.loading", "companion.models.weights.convert", "companion.models.tiny_pair.pair_folder", "companion.models.tiny_pair.report")
#: The training code left in the package (SmolLM2's drafter recipe); the closed world's was retired.
TRAINERS = ("companion.models.distill.train", "companion.models.distill.build", "companion.models.distill.data")


@pytest.mark.parametrize("loader", LOADERS)
def test_the_loader_of_a_pair_reaches_no_trainer(loader) -> None:
    """Not even through a function-level import: loading or describing a pair never imports training code."""
    reached = reachable(import_graph(), loader)
    assert not reached & set(TRAINERS), f"{loader} imports {sorted(reached & set(TRAINERS))}"


def test_loading_the_pair_imports_no_trainer_in_a_fresh_interpreter() -> None:
    """The same, on a real interpreter: load the embedded pair, read its manifest, then list sys.modules."""
    code = ("import sys\n"
            "from companion.models.loading import load_pair\n"
            "from companion.models.tiny_pair import ASSET_DIR\n"
            "from companion.models.tiny_pair.report import read_pair_manifest\n"
            "read_pair_manifest(ASSET_DIR)\n"
            "load_pair()\n"
            "print(' '.join(sorted(m for m in sys.modules if m.startswith('companion'))))\n")
    env = {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    loaded = set(out.stdout.split())
    assert "companion.models.loading" in loaded and "companion.models.tiny_pair.report" in loaded
    assert not loaded & set(TRAINERS), sorted(loaded & set(TRAINERS))


#: The package's floors, lowest first; a module may import its own floor and the floors below it.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("atomic", "parsing", "assets", "checks"),
    ("certify",),
    ("symbolic",),
    ("drafter",),
    ("models", "prompts"),
    ("harvest",),
    ("speculative",),
    ("analysis",),
    ("figures",),
    ("book",),
    ("cli", "cli_runner", "__main__"),
)
#: Upward imports kept on purpose, each with its reason. SmolLM2's drafter recipe (``build-drafter``)
#: distils from a harvest of its target: the trainer lives beside the models it builds.
#: The kernel-path record's percentiles use the book's one quantile convention (an order statistic), which
#: lives with the analysis of traces.
UPWARD_ALLOWED = {("companion.models.distill.data", "companion.harvest"),
                  ("companion.harvest.kernel_paths", "companion.analysis.traces")}


def floor_of(module: str) -> int:
    """The index in :data:`LAYERS` of ``companion.<part>...``'s floor (``companion`` itself: the top)."""
    parts = module.split(".")
    if len(parts) == 1:
        return len(LAYERS) - 1
    return next(i for i, names in enumerate(LAYERS) if parts[1] in names)


def upward_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    return sorted((a, b) for a, targets in graph.items() for b in targets
                  if floor_of(b) > floor_of(a) and (a, b) not in UPWARD_ALLOWED)


def test_every_part_of_the_package_has_a_floor() -> None:
    tops = {name.split(".")[1] for name in import_graph() if "." in name}
    assert tops <= {n for names in LAYERS for n in names}, tops - {n for names in LAYERS for n in names}


def test_imports_point_down_the_layers() -> None:
    """certify -> drafter -> models/prompts -> harvest -> speculative -> analysis -> figures -> book -> cli:
    no module imports one on a higher floor, not even lazily (issue 56: the chapters' harvest cache and
    the full profile reached up into the book and the analysis)."""
    assert upward_imports({"companion.harvest.x": {"companion.book.y"}, "companion.book.y": {"companion.harvest.x"}}) \
        == [("companion.harvest.x", "companion.book.y")]  # the check itself sees an upward edge
    up = upward_imports(import_graph())
    assert not up, "imports that point up the layers: " + "; ".join(f"{a} -> {b}" for a, b in up)
