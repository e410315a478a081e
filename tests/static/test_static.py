"""Lint, format and strict typing are part of the test suite."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests.support.paths import REPO_ROOT

ROOT = REPO_ROOT


@pytest.mark.parametrize(
    "argv",
    [
        [sys.executable, "-m", "ruff", "check", "."],
        [sys.executable, "-m", "ruff", "format", "--check", "."],
        [sys.executable, "-m", "mypy"],
    ],
    ids=["ruff-check", "ruff-format", "mypy-strict"],
)
def test_static_checks_pass(argv: list[str]) -> None:
    assert shutil.which("git")  # the repo is checked from its root
    res = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]


def test_the_import_layers_hold() -> None:
    """The contracts of ``[tool.importlinter]`` in pyproject.toml: the controller's layers
    (every import counted, at module level, in a function or for type checking alone) and an
    agent that imports nothing of the controller. A new cycle breaks the layers."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'sandbox-image'}"}
    argv = [sys.executable, "-c", "from importlinter.cli import lint_imports_command as c; c()"]
    res = subprocess.run(
        argv, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False, env=env
    )
    assert res.returncode == 0, res.stdout[-6000:] + res.stderr[-2000:]
    assert "Contracts: 3 kept, 0 broken." in res.stdout


def _module_map() -> set[str]:
    """The paths the architecture page's module map names (``a.py``, ``pkg/``)."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    table = text.split("## Module map", 1)[1].split("\n## ", 1)[0]
    names: set[str] = set()
    for line in table.splitlines():
        if line.startswith("| `"):
            first = line.split("|")[1]
            names |= {part.strip().strip("`") for part in first.split(",")}
    return names


def test_the_architecture_page_and_the_tree_agree() -> None:
    """Every module of ``controller/`` is in the module map, and every entry there exists."""
    root = ROOT / "controller"
    named = _module_map()
    folders = {n for n in named if n.endswith("/")}
    modules = {
        p.relative_to(root).as_posix()
        for p in root.rglob("*.py")
        if p.name not in {"__init__.py", "__main__.py"}
        and not any(p.relative_to(root).as_posix().startswith(f) for f in folders)
    }
    assert modules - named == set(), "modules missing from docs/architecture.md"
    missing = {n for n in named if not (root / n).exists()}
    assert missing == set(), "the module map names what is not in the tree"


def test_no_test_module_imports_another() -> None:
    """Shared helpers live in ``tests/support/``: a test module imports nothing from another
    test module (each runs on its own, in any order, in any tier)."""
    import ast

    found = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        if path.parts[-2] == "support" or "support" in path.relative_to(ROOT / "tests").parts:
            continue
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            for name in names:
                parts = name.split(".")
                if parts[0] == "tests" and len(parts) > 1 and parts[1] != "support":
                    found.append(f"{path.relative_to(ROOT)}: {name}")
    assert found == []


MAX_UNTYPED_DICTS = 40
"""Lines of controller/ that declare a ``dict[str, Any]``: JSON edges (JSON Schema and
OpenAPI documents, wire frames, the job log's lines, Docker's keyword arguments); a record
or a view crossing modules is typed."""


def test_untyped_dicts_stay_within_their_budget() -> None:
    lines = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in sorted((ROOT / "controller").rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if "dict[str, Any]" in line
    ]
    assert len(lines) <= MAX_UNTYPED_DICTS, lines


MAX_MODULE_LINES = 500


def test_modules_stay_under_500_lines() -> None:
    """A module over 500 lines has more than one concept in it: split along its seams (the
    controller's and the agent's)."""
    paths = [*(ROOT / "controller").rglob("*.py"), *(ROOT / "sandbox-image").rglob("*.py")]
    long = {
        str(path.relative_to(ROOT)): count
        for path in sorted(paths)
        if (count := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}
