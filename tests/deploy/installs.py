"""Virtualenvs that hold what ``pip install '.[EXTRAS]'`` would install and nothing else,
made offline from the test run's own environment (which has every extra): the closure of
modelfleet's requirements, read from ``pyproject.toml`` and the installed distributions'
metadata, linked into a fresh ``venv``. A process started with that venv's python (and
every child it starts with ``sys.executable``) finds only those distributions, so an
import of a package that the install leaves out fails there as it would in an image."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from collections.abc import Iterable
from fnmatch import fnmatch
from importlib import metadata
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
PROJECT = "modelfleet"


def _project() -> dict[str, Any]:
    with (ROOT / "pyproject.toml").open("rb") as f:
        return dict(tomllib.load(f))


def _applies(req: Requirement, extras: Iterable[str]) -> bool:
    """Whether ``req`` is installed on this machine when ``extras`` of its owner are asked for."""
    return req.marker is None or any(req.marker.evaluate({"extra": e}) for e in ("", *extras))


def requirements(extras: Iterable[str]) -> list[Requirement]:
    """modelfleet's own requirements with ``extras`` (``modelfleet[central]`` inside an extra expanded)."""
    project = _project()["project"]
    found = [Requirement(r) for r in project["dependencies"]]
    todo, seen = list(extras), set()
    while todo:
        extra = todo.pop()
        if extra not in seen:
            seen.add(extra)
            for req in map(Requirement, project["optional-dependencies"][extra]):
                if canonicalize_name(req.name) == PROJECT:
                    todo.extend(req.extras)
                else:
                    found.append(req)
    return [r for r in found if _applies(r, ())]


def distributions(extras: Iterable[str]) -> dict[str, metadata.Distribution]:
    """Every distribution ``pip install '.[extras]'`` installs (by canonical name), as
    installed here; a missing one fails with its name (the dev environment has them all)."""
    found: dict[str, metadata.Distribution] = {}
    visited: set[tuple[str, frozenset[str]]] = set()
    todo = requirements(extras)
    while todo:
        req = todo.pop()
        name, wanted = canonicalize_name(req.name), frozenset(req.extras)
        if (name, wanted) in visited:
            continue
        visited.add((name, wanted))
        try:
            dist = found.get(name) or metadata.distribution(req.name)
        except metadata.PackageNotFoundError as exc:
            raise AssertionError(f"{req} is required but not installed in {sys.prefix}") from exc
        found[name] = dist
        todo += [r for r in map(Requirement, dist.requires or []) if _applies(r, wanted)]
    return found


def project_packages() -> list[str]:
    """The top-level packages the wheel ships (``[tool.setuptools.packages.find]``)."""
    include = _project()["tool"]["setuptools"]["packages"]["find"]["include"]
    return sorted(
        d.name for d in ROOT.iterdir() if (d / "__init__.py").is_file() and any(fnmatch(d.name, p) for p in include)
    )


def _link(target: Path, source: Path) -> None:
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        target.symlink_to(source)


def make_venv(path: Path, extras: Iterable[str]) -> Path:
    """A venv at ``path`` with modelfleet's packages and the closure of its requirements
    with ``extras`` (each distribution's top-level entries linked); returns its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    site = path / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    for dist in distributions(extras).values():
        for file in dist.files or []:
            top = file.parts[0]
            if top == "..":  # scripts in bin/
                continue
            if top == "__pycache__":  # shared by single-module distributions: link their own files only
                _link(site / file, Path(str(dist.locate_file(file))))
            else:
                _link(site / top, Path(str(dist.locate_file(top))))
    for package in project_packages():
        _link(site / package, ROOT / package)
    return path / "bin" / "python"
