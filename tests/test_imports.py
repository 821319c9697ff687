"""The package's import graph has no circles, and ``import papa_surgery`` stays light.

The graph is read from the source with ``ast``: every ``import`` statement counts, at module level and
inside functions (a function-level import only postpones a circle, it does not remove it). The one
exception is what PEP 562 makes lazy on purpose: imports inside a package ``__init__``'s ``__getattr__``
belong to a separate node, ``<package>:lazy``, that only ``from <package> import <lazy name>`` reaches;
``from papa_surgery import __version__`` finds a plain attribute and never runs ``__getattr__``.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "papa_surgery"
PACKAGE = ROOT.name


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = [PACKAGE, *path.relative_to(ROOT).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _lazy_table(init: Path) -> dict[str, str]:
    """``{name: submodule}`` a package ``__init__`` hands out through ``__getattr__`` (its ``_LAZY`` table)."""
    for node in ast.parse(init.read_text()).body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "_LAZY" for t in targets):
                return ast.literal_eval(node.value)
    return {}


def _lazy_function_nodes(tree: ast.Module) -> set[int]:
    """ids of the AST nodes inside a module-level ``def __getattr__``."""
    ids = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "__getattr__":
            ids |= {id(n) for n in ast.walk(node)}
    return ids


def import_graph() -> dict[str, set[str]]:
    """``{module: {module it imports, ...}}`` for every module of the package (internal edges only)."""
    modules = _modules()
    lazy = {name: _lazy_table(path) for name, path in modules.items() if path.name == "__init__.py"}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, table in lazy.items():  # __getattr__ imports the table's submodules by name (importlib)
        graph[f"{name}:lazy"] = {f"{name}.{module}" for module in table.values()}

    def target(package: str, attr: str | None) -> str | None:
        if attr is not None:
            if attr in lazy.get(package, ()):
                return f"{package}:lazy"
            if f"{package}.{attr}" in modules:
                return f"{package}.{attr}"
        return package if package in modules else None

    for name, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        in_lazy = _lazy_function_nodes(tree) if path.name == "__init__.py" else set()
        here = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        for node in ast.walk(tree):
            source = f"{name}:lazy" if id(node) in in_lazy else name
            found: list[str | None] = []
            if isinstance(node, ast.Import):
                found = [target(alias.name, None) for alias in node.names if alias.name.startswith(PACKAGE)]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here.split(".")
                    base = base[: len(base) - (node.level - 1)]
                    package = ".".join(base + ([node.module] if node.module else []))
                elif node.module and node.module.split(".")[0] == PACKAGE:
                    package = node.module
                else:
                    continue
                found = [target(package, alias.name) for alias in node.names]
            found += [parent for t in found if t is not None for parent in _packages_run_first(t, source, modules)]
            graph[source] |= {t for t in found if t is not None and t != source}
    return graph


def _packages_run_first(target: str, importer: str, modules: dict) -> list[str]:
    """The packages whose ``__init__`` runs when ``importer`` imports ``target``: its ancestors (below the root,
    whose ``__init__`` imports nothing eagerly), except those that contain the importer (already running)."""
    parts = target.split(".")
    out = []
    for i in range(2, len(parts)):
        package = ".".join(parts[:i])
        if package in modules and not (importer == package or importer.startswith(package + ".")):
            out.append(package)
    return out


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
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
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_walker_sees_function_level_imports_and_reports_a_cycle():
    graph = import_graph()
    assert f"{PACKAGE}.ranking.lambdas" in graph[f"{PACKAGE}.ranking.methods"]  # a function-level import
    assert f"{PACKAGE}.ranking.order" in graph[f"{PACKAGE}.ranking.lambdas"]  # a module-level one
    assert f"{PACKAGE}.api" in graph[f"{PACKAGE}:lazy"]
    # importing a.b.c runs the package a.b first: an edge to it, unless the importer is inside it
    assert f"{PACKAGE}.calibration" in graph[f"{PACKAGE}.conversion.surgery"]
    assert f"{PACKAGE}.conversion" not in graph[f"{PACKAGE}.conversion.surgery"]
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


def test_the_package_has_no_import_cycles():
    cycles = find_cycles(import_graph())
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


@pytest.mark.parametrize("leaf", ["ranking.order", "probing", "tasks", "hub_code", "analysis", "registry", "options"])
def test_leaves_do_not_reach_up(leaf):
    """The Ranking object, probing, tasks and hub_code know nothing of ranking strategies, conversion, sweeps or
    the front ends; analyses return score tables; the registry and options are facts every layer reads."""
    graph = import_graph()
    start = [m for m in graph if m == f"{PACKAGE}.{leaf}" or m.startswith(f"{PACKAGE}.{leaf}.")]
    seen, todo = set(start), list(start)
    while todo:
        for w in graph[todo.pop()]:
            if w not in seen:
                seen.add(w)
                todo.append(w)
    above = ("ranking.methods", "ranking.lambdas", "conversion", "experiments", "workflow", "api", "cli")
    reached = {m for m in seen if any(m == f"{PACKAGE}.{a}" or m.startswith(f"{PACKAGE}.{a}.") for a in above)}
    assert not reached, f"{leaf} imports {sorted(reached)}"


def test_import_papa_surgery_and_help_stay_torch_free():
    code = (
        "import sys, json, papa_surgery\n"
        "names = sorted(papa_surgery.__all__)\n"
        "print(json.dumps({'heavy': sorted(m for m in ('torch', 'transformers') if m in sys.modules), 'all': names}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    report = json.loads(out.stdout)
    assert report["heavy"] == []
    assert {"calibrate", "rank", "convert", "probe", "analyze", "Constants", "Ranking"} <= set(report["all"])
    help_code = (
        "import sys\nfrom click.testing import CliRunner\nfrom papa_surgery.cli import main\n"
        "result = CliRunner().invoke(main, ['--help'])\nassert result.exit_code == 0, result.output\n"
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", help_code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_no_module_is_over_400_lines():
    """docs/design.md: small modules with one job each (split by job when one grows past 400 lines)."""
    root = Path(__file__).resolve().parents[1] / PACKAGE
    long = {str(p.relative_to(root)): n for p in root.rglob("*.py") if (n := len(p.read_text().splitlines())) > 400}
    assert not long, f"modules over 400 lines: {long}"


STAGES = (
    "calibration", "ranking", "conversion", "healing", "tasks", "probing", "finetuning", "experiments", "report",
    "analysis", "workflow", "cli", "models", "outputs", "options", "hub_code",
)  # fmt: skip


def test_a_house_by_concept():
    """At most 10 modules at the package root besides subpackages; every stage is a subpackage (a module, never a
    function that shadows it); the workflow functions are ``papa_surgery``'s attributes, not modules."""
    import importlib
    import types

    import papa_surgery

    root_modules = sorted(p.name for p in ROOT.glob("*.py"))
    assert len(root_modules) <= 10, root_modules
    for stage in STAGES:
        module = importlib.import_module(f"{PACKAGE}.{stage}")
        assert isinstance(module, types.ModuleType) and module.__file__.endswith("__init__.py"), stage
        assert isinstance(getattr(papa_surgery, stage), types.ModuleType), stage
    for name in ("calibrate", "rank", "convert", "save", "probe", "finetune", "analyze", "distill", "load"):
        assert callable(getattr(papa_surgery, name)) and not isinstance(getattr(papa_surgery, name), types.ModuleType)
        assert not (ROOT / f"{name}.py").exists() and not (ROOT / name).is_dir(), f"{name} shadows a module"
    for package_init in ROOT.rglob("__init__.py"):  # no package attribute shadows one of its modules
        package = importlib.import_module(".".join([PACKAGE, *package_init.parent.relative_to(ROOT).parts]))
        for child in package_init.parent.iterdir():
            name = child.stem if child.suffix == ".py" else child.name if (child / "__init__.py").exists() else None
            if name and name != "__init__" and hasattr(package, name):
                assert isinstance(getattr(package, name), types.ModuleType), f"{package.__name__}.{name} is shadowed"


def test_the_checkpoint_entry_file_imports_every_shipped_sibling():
    """transformers before 5.23 copies only ``modeling_papa.py``'s own relative imports into its module cache when
    loading a checkpoint folder: a sibling reached only through another one is missing there (a fresh
    ``trust_remote_code`` load on the floor version fails with "No such file ... dense_slots.py")."""
    import re

    hub = Path(__file__).resolve().parents[1] / "papa_surgery" / "hub_code"
    entry = (hub / "modeling_papa.py").read_text()
    imported = set(re.findall(r"^from \.(\w+) import", entry, flags=re.MULTILINE))
    shipped = {p.stem for p in hub.glob("*.py")} - {"__init__", "modeling_papa"}
    assert shipped <= imported, f"import these in modeling_papa.py for the copy: {sorted(shipped - imported)}"
