"""Packaging that pyproject.toml cannot say alone: ship the top-level ``profiles/`` folder (device
catalog, example clusters, model profiles) inside the wheel as the ``hetplan_profiles`` package, so a
non-editable install finds it (see planner/contracts/paths.py)."""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["planner", "planner.*"]), "hetplan_profiles"],
    package_dir={"hetplan_profiles": "profiles"},
    package_data={"hetplan_profiles": ["*.yaml", "clusters/*.yaml", "models/*.yaml"]},
)
