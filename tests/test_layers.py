"""The layers, checked from the source (every import, also those inside functions):

- the engine core (``tuner/`` but the client and the application) knows no service, store or
  kernel: it imports none of ``api``, ``db``, ``search_spaces``, the client or the application;
- the client library a model's process imports (``tuner.client``, ``tuner.autotune``,
  ``tuner.install()``, configs files) imports no service, store or application module;
- ``db`` imports only the few value modules of the core it stores (errors, settings, job
  lifecycle, timing methods, configs, identity, shapes, job specs), never ``api`` or the kernels;
- ``search_spaces`` (the kernels) know the engine only through its core;
- ``api`` imports no CLI module;
- no import cycle runs through the application (the CLI's modules were a circle of four).

README's "Where things are" draws the same layers."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("tuner", "db", "api", "search_spaces")
def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


MODULES = _modules()


#: what a model's process imports to be served (tuner.client, tuner.autotune, tuner.install)
CLIENT = {"tuner.client", "tuner.autotuning", "tuner.installing", "tuner.configs_file",
          "tuner.export_fla", "tuner.run"}
#: the application around the engine (the package ``tuner.app``): the worker, the service's
#: dispatch, the CLI
APP = {name for name in MODULES if name == "tuner.app" or name.startswith("tuner.app.")}
CLI = {"tuner.app.cli", "tuner.app.cli_commands", "tuner.app.cli_service", "tuner.app.cli_common",
       "tuner.app.sweep", "tuner.app.tune_report"}
#: the core modules ``db`` may import: values it stores
#: (``tuner.job_spec``: what a job was submitted for, the one value the route, the CLI, the
#: repository and the worker share)
DB_MAY_IMPORT = {"tuner.errors", "tuner.settings", "tuner.lifecycle", "tuner.timing",
                 "tuner.config", "tuner.identity", "tuner.shapes", "tuner.job_spec"}




def _imports(path: Path) -> set[str]:
    """The project modules ``path`` imports, anywhere in it (``from a import b`` counts ``a``,
    and ``a.b`` where that is a module)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return {name for name in names if name in MODULES}


GRAPH = {module: _imports(path) - {module} for module, path in MODULES.items()}


def _layer(module: str) -> str:
    if module in CLIENT:
        return "client"
    if module in APP:
        return "app"
    if module == "tuner":
        return "facade"  # the package: tuner.autotune, tuner.install, tuner.Kernel, ...
    return module.split(".")[0]  # tuner (the core), db, api, search_spaces


def _violations(layer: str, forbidden: set[str], allowed: set[str] | None = None) -> list[str]:
    out = []
    for module, imported in sorted(GRAPH.items()):
        if _layer(module) != layer:
            continue
        for name in sorted(imported):
            if name == "tuner":
                continue
            if _layer(name) in forbidden or (allowed is not None and _layer(name) == "tuner"
                                             and name not in allowed):
                out.append(f"{module} imports {name}")
    return out


@pytest.mark.parametrize(("layer", "forbidden"), [
    ("tuner", {"api", "db", "search_spaces", "client", "app"}),
    ("client", {"api", "db", "app"}),
    ("search_spaces", {"api", "db", "client", "app"}),
    ("db", {"api", "search_spaces", "client", "app"}),
])
def test_no_layer_imports_upward(layer, forbidden):
    allowed = DB_MAY_IMPORT if layer == "db" else None
    assert _violations(layer, forbidden, allowed) == []


def test_the_service_imports_no_cli_module():
    assert [f"{m} imports {n}" for m, names in sorted(GRAPH.items()) if _layer(m) == "api"
            for n in sorted(names & CLI)] == []


def _cycle_through(start: str) -> list[str] | None:
    """An import path from ``start`` back to itself, if any (depth first)."""
    stack = [(start, [start])]
    seen: set[str] = set()
    while stack:
        module, path = stack.pop()
        for name in GRAPH.get(module, ()):
            if name == start:
                return [*path, name]
            if name not in seen:
                seen.add(name)
                stack.append((name, [*path, name]))
    return None


@pytest.mark.parametrize("module", sorted(APP))
def test_no_import_cycle_runs_through_the_application(module):
    assert _cycle_through(module) is None


def test_the_check_sees_the_layers_it_names():
    """The rules name real modules, and the graph sees imports made inside functions (the CLI
    loads its command modules lazily): a rule over names that no longer exist checks nothing."""
    assert (CLIENT | DB_MAY_IMPORT) <= set(MODULES)
    assert {"tuner.app.worker", "tuner.app.cli", "tuner.app.dispatch.procrastinate"} <= APP
    assert {"tuner.app.cli_commands", "tuner.app.cli_service"} <= GRAPH["tuner.app.cli"]
    assert "db" in GRAPH["tuner.app.worker"] and "search_spaces" in GRAPH["tuner.app.worker"]
