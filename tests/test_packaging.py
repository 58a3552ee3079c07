"""Packaging: version ranges in pyproject.toml, exact pins in constraints.txt, PEP 561 marker."""

from __future__ import annotations

import importlib.resources
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
TYPED_PACKAGES = ("pyro_invariance", "pyro_invariance.models", "pyro_invariance.guides")


@pytest.fixture(scope="module")
def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def constraints() -> dict[str, Requirement]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            req = Requirement(line)
            pins[_normalise(req.name)] = req
    return pins


def _normalise(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def _direct_requirements(pyproject: dict) -> list[Requirement]:
    """[project.dependencies] and the extras that `make install` installs."""
    project = pyproject["project"]
    extras = project["optional-dependencies"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    for extra in ("dev", "tutorials", "docs"):
        reqs += [Requirement(r) for r in extras[extra]]
    return reqs


def test_dependencies_are_ranges_not_pins(pyproject):
    """Installing into an existing environment must not replace the user's torch."""
    reqs = {_normalise(Requirement(r).name): Requirement(r) for r in pyproject["project"]["dependencies"]}
    assert {"torch", "torchvision"} <= set(reqs)
    for name, req in reqs.items():
        exact = [s for s in req.specifier if s.operator in ("==", "===")]
        assert not exact, f"{req}: pin exact versions in constraints.txt, not in [project.dependencies]"
    assert reqs["torch"].specifier, "torch needs a lower bound"


def test_constraints_pin_torch(constraints):
    for name in ("torch", "torchvision"):
        assert name in constraints, f"constraints.txt does not pin {name}"
        (spec,) = constraints[name].specifier
        assert spec.operator == "==", f"constraints.txt: {constraints[name]} is not an exact pin"


def test_every_direct_requirement_is_pinned_within_its_range(pyproject, constraints):
    """`make install` resolves exactly: each direct requirement has a pin, and the pin is allowed."""
    for req in _direct_requirements(pyproject):
        pin = constraints.get(_normalise(req.name))
        assert pin is not None, f"{req.name} is required but not pinned in constraints.txt"
        (spec,) = pin.specifier
        assert spec.operator == "==", f"constraints.txt: {pin} is not an exact pin"
        assert req.specifier.contains(spec.version, prereleases=True), (
            f"constraints.txt pins {pin}, outside pyproject.toml's {req}"
        )


def test_makefile_installs_with_constraints():
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert "-c constraints.txt" in makefile
    assert "docs]" in makefile  # the docs extra, so that tests/test_docs.py runs under `make test`


@pytest.mark.parametrize("package", TYPED_PACKAGES)
def test_py_typed_is_installed(package):
    assert (importlib.resources.files(package) / "py.typed").is_file()


def test_py_typed_is_package_data(pyproject):
    """An editable install finds py.typed in the source tree either way; a wheel needs package-data."""
    package_data = pyproject["tool"]["setuptools"]["package-data"]
    for package in TYPED_PACKAGES:
        assert "py.typed" in package_data.get(package, []), f"{package}: py.typed missing from package-data"
