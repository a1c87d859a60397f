"""Imports point one way: the project's modules form no cycle (type-only imports included)
and no module takes another's private name. Read from the source with ``ast``, under
setup.py's package-dir mapping, so a new module is covered without a list here."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_DIRS = {"autoplan": "autoplan", "autoplan.costmodels": "costmodels",
                "autoplan.plugins": "plugins"}  # setup.py's PACKAGE_DIRS


def _modules() -> dict[str, Path]:
    found = {}
    for package, folder in PACKAGE_DIRS.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = [p for p in path.relative_to(ROOT / folder).with_suffix("").parts
                     if p != "__init__"]
            found[".".join([package, *parts])] = path
    return found


def _imports(sources: dict[str, str]) -> tuple[nx.DiGraph, list[tuple[str, str, str]]]:
    """The graph of module -> imported module over the modules' ``sources``, and every
    (importer, module, name) of a private name taken from another module."""
    graph, private = nx.DiGraph(), []
    modules = set(sources)
    for name, source in sources.items():
        graph.add_node(name)
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in modules:
                for alias in node.names:
                    member = f"{node.module}.{alias.name}"
                    graph.add_edge(name, member if member in modules else node.module)
                    if alias.name.startswith("_") and node.module != name:
                        private.append((name, node.module, alias.name))
            elif isinstance(node, ast.Import):
                graph.add_edges_from((name, a.name) for a in node.names if a.name in modules)
    return graph, private


@pytest.fixture(scope="module")
def imports():
    modules = _modules()
    assert "autoplan.costmodels.sync" in modules and "autoplan.plugins.megatron" in modules
    return _imports({name: path.read_text() for name, path in modules.items()})


def test_no_module_imports_itself_back(imports):
    graph, _ = imports
    cycles = [cycle for cycle in nx.simple_cycles(graph) if len(cycle) > 1]
    assert cycles == []


def test_no_private_name_crosses_modules(imports):
    _, private = imports
    assert private == []


def test_the_reader_sees_the_imports_it_checks():
    # The check itself: a type-only cycle and a private import in two toy modules are found.
    graph, private = _imports({
        "autoplan.a": "from autoplan.b import _hidden\n",
        "autoplan.b": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                      "    from autoplan.a import thing\n"})
    assert [sorted(c) for c in nx.simple_cycles(graph)] == [["autoplan.a", "autoplan.b"]]
    assert private == [("autoplan.a", "autoplan.b", "_hidden")]
