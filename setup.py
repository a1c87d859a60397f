"""Package discovery for a layout pyproject.toml cannot express: autoplan.costmodels lives in
costmodels/ and autoplan.plugins in plugins/. Every package under each root is found, so a
new subpackage (autoplan.zoo was once missed by a hand-written list) ships in the wheel."""

from setuptools import find_packages, setup

PACKAGE_DIRS = {"autoplan": "autoplan", "autoplan.costmodels": "costmodels",
                "autoplan.plugins": "plugins"}


def discovered_packages() -> list[str]:
    """Each root package and every package below its folder, named under the root."""
    return sorted({name for root, folder in PACKAGE_DIRS.items()
                   for name in [root, *(f"{root}.{sub}" for sub in find_packages(folder))]})


if __name__ == "__main__":  # setuptools runs this file as __main__; tests import it
    setup(package_dir=PACKAGE_DIRS, packages=discovered_packages())
