"""Packaging that pyproject.toml cannot say alone: the source folder ``planner/`` installs as the one
import package ``hetplan`` (the only name this distribution adds to site-packages), with the top-level
``cli.py`` inside it as ``hetplan.cli`` (``planner/cli.py`` is a link to it) and the top-level
``profiles/`` folder (device catalog, example clusters, model profiles) as ``hetplan.bundled``, so a
non-editable install finds it (see planner/contracts/paths.py)."""

from setuptools import find_packages, setup

SOURCE = "planner"
PACKAGES = ["hetplan" + name[len(SOURCE) :] for name in find_packages(include=[SOURCE, f"{SOURCE}.*"])]

setup(
    packages=[*PACKAGES, "hetplan.bundled"],
    package_dir={"hetplan": SOURCE, "hetplan.bundled": "profiles"},
    package_data={"hetplan.bundled": ["*.yaml", "clusters/*.yaml", "models/*.yaml"]},
)
