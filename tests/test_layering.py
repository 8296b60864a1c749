"""The package layout's one direction of imports (docs/architecture.md draws it): each module
imports, when it is loaded, only modules of its own layer or of layers below (imports inside
functions are deliberate late imports of heavy or optional libraries and tools, and are not
counted there), and the modules of fastrun and of the algorithm library form no circle, every
import counted: late ones and those under ``if TYPE_CHECKING`` too."""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent / "fastrun"
LIBRARY = pathlib.Path(__file__).resolve().parent.parent / "algorithms" / "fastrun_algorithms"

#: Layers from the bottom: the base (settings, category facts, formats and the plugin API:
#: algorithm, operator, attribute, registry), the cache and the devices (side by side, neither
#: importing the other), the decision machinery, the session facade, the runtime, the analysis
#: tools, fleet tuning, the CLI.
LAYERS = {"base": 0, "cache": 1, "devices": 1, "core": 2, "facade": 3, "runtime": 4,
          "analysis": 5, "fleet": 6, "cli": 7}


def _modules(root: pathlib.Path = ROOT) -> dict[str, pathlib.Path]:
    found = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _layer(module: str) -> str:
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in LAYERS:
        return parts[1]
    if module in ("fastrun", "fastrun.api"):
        return "facade"
    if module == "fastrun.__main__":
        return "cli"
    return "base"


def _imports(path: pathlib.Path, modules: dict[str, pathlib.Path],
             everywhere: bool = False) -> set[str]:
    """The fastrun modules ``path`` imports at module level (``if TYPE_CHECKING`` blocks and
    function bodies left out), or with ``everywhere`` anywhere in it."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = set()
    for node in ast.walk(tree) if everywhere else tree.body:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            submodules = {f"{node.module}.{alias.name}" for alias in node.names} & set(modules)
            # "from fastrun import config" loads the module config, not what the package exports
            found.update(submodules or {node.module})
    return {name for name in found if name in modules}


def _circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of ``graph`` (module -> the modules it imports), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(name: str) -> list[str] | None:
        state[name] = 1
        stack.append(name)
        for target in sorted(graph[name]):
            if state.get(target) == 1:
                return [*stack[stack.index(target):], target]
            if target not in state:
                circle = visit(target)
                if circle:
                    return circle
        stack.pop()
        state[name] = 2
        return None

    for name in sorted(graph):
        if name not in state:
            circle = visit(name)
            if circle:
                return circle
    return None


def test_every_import_goes_down_the_layers():
    modules = _modules()
    wrong = []
    for name, path in modules.items():
        for target in _imports(path, modules):
            mine, theirs = _layer(name), _layer(target)
            sideways = mine != theirs and LAYERS[mine] == LAYERS[theirs]
            if LAYERS[theirs] > LAYERS[mine] or sideways:
                wrong.append(f"{name} ({mine}) imports {target} ({theirs})")
    assert not wrong, "\n".join(sorted(wrong))


def test_the_module_graph_has_no_circle():
    """Over fastrun and the algorithm library, every import counted (a late one still makes
    the two modules depend on each other)."""
    modules = {**_modules(), **_modules(LIBRARY)}
    graph = {name: _imports(path, modules, everywhere=True) - {name}
             for name, path in modules.items()}
    # a package's __init__ importing its own submodules is how a package exports them
    for name in graph:
        graph[name] = {t for t in graph[name] if not t.startswith(name + ".")}
    circle = _circle(graph)
    assert circle is None, " -> ".join(circle)


def test_every_package_says_its_job_and_what_it_may_import():
    for init in ROOT.rglob("__init__.py"):
        if init.parent == ROOT:
            continue
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
        assert doc, f"{init} has no docstring"
        assert "may import" in doc, f"{init}'s docstring does not say what it may import"


def test_the_top_of_the_package_holds_the_plugin_api_and_little_else():
    """At most 8 modules at the top of ``fastrun/`` (besides ``__init__``, ``__main__`` and
    ``_version``): the plugin API, which plugins import from there, the settings and the
    facade; every other piece lives in the package of its layer (``base``, ``core``, ...)."""
    top = sorted(path.stem for path in ROOT.glob("*.py")
                 if path.stem not in ("__init__", "__main__", "_version"))
    assert len(top) <= 8, top
