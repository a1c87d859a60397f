"""The wheel's package list: every folder with an __init__.py under the three package roots
ships, named through the package-dir mapping (autoplan.zoo was once left out of a hand list,
and every example that imports it broke in a non-editable install). `.ci/run` also builds the
wheel, installs it into a clean venv and solves an example from outside the checkout."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _setup_module():
    spec = importlib.util.spec_from_file_location("autoplan_setup", ROOT / "setup.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _packages_on_disk() -> set[str]:
    # The mapping of pyproject's former [tool.setuptools] package-dir, written out here.
    roots = {"autoplan": ROOT / "autoplan", "autoplan.costmodels": ROOT / "costmodels",
             "autoplan.plugins": ROOT / "plugins"}
    return {".".join([name, *init.parent.relative_to(folder).parts])
            for name, folder in roots.items() for init in folder.rglob("__init__.py")}


def test_every_package_folder_is_in_the_wheel():
    setup = _setup_module()
    assert set(setup.discovered_packages()) == _packages_on_disk()
    assert "autoplan.zoo" in setup.discovered_packages()
