"""Helpers of tests/unit/cli/test_ci.py and tests/docker/cli/test_ci.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import yaml

from tests.support.git import init
from tests.support.jobs import FILES
from tests.support.loopback import LoopbackServer
from tests.support.paths import REPO_ROOT

ROOT = REPO_ROOT
DOC = (ROOT / "docs" / "ci.md").read_text()
TESTS = (
    "from app import greet\n\n\ndef test_capital():\n    assert greet('x') == 'Hello x'\n\n\n"
    "def test_name():\n    assert greet('x').endswith('x')\n"
)


def junit_root(path: Path) -> ET.Element:
    """The report patchbox wrote (its own output, not untrusted input)."""
    return ET.fromstring(path.read_bytes())  # noqa: S314


def the_command() -> str:
    """The command of docs/ci.md's step: the block after the ``ci-script`` marker."""
    found = re.search(r"<!-- ci-script -->\n```sh\n(.*?)```", DOC, re.DOTALL)
    assert found is not None
    return found.group(1).strip()


def verify_command() -> str:
    """The command of docs/ci.md's verifying step: the block after ``verify-script``."""
    found = re.search(r"<!-- verify-script -->\n```sh\n(.*?)```", DOC, re.DOTALL)
    assert found is not None, "docs/ci.md has no verify-script block"
    return found.group(1).strip()


def workflow(section: str) -> dict[Any, Any]:
    """The YAML example under docs/ci.md's ``## section`` heading, parsed."""
    found = re.search(
        rf"^## {re.escape(section)}\n.*?```yaml\n(.*?)```", DOC, re.DOTALL | re.MULTILINE
    )
    assert found is not None, section
    data: dict[Any, Any] = yaml.safe_load(found.group(1))
    return data


def github_steps() -> list[dict[str, Any]]:
    steps: list[dict[str, Any]] = workflow("GitHub Actions")["jobs"]["patchbox"]["steps"]
    return steps


def gitlab_script() -> list[str]:
    script: list[str] = workflow("GitLab CI")["patchbox"]["script"]
    return script


def project(
    root: Path, checks: dict[str, Any], prompt: str, *, baseline_checks: bool = True
) -> Path:
    task = {
        "prompt": prompt,
        "checks": checks,
        "baseline_checks": baseline_checks,
        "limits": {"memory_mb": 512, "workspace_mb": 64, "tmp_mb": 32, "wall_seconds": 300},
    }
    files = {**FILES, "test_app.py": TESTS, ".patchbox/task.json": json.dumps(task)}
    return init(root, files, message="start").path


KEY = "sk-ci-test-key-123456"


def runner_env(server: LoopbackServer, bin_dir: Path) -> dict[str, str]:
    """The runner's environment: ``patchbox`` on PATH as installed, the test provider."""
    bin_dir.mkdir(exist_ok=True)
    shim = bin_dir / "patchbox"
    path = f"{ROOT}:{ROOT}/sandbox-image"
    shim.write_text(f'#!/bin/sh\nPYTHONPATH="{path}" exec "{sys.executable}" -m controller "$@"\n')
    shim.chmod(0o755)
    return {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "OPENAI_BASE_URL": f"{server.url}/v1",
        "OPENAI_API_KEY": KEY,
        "PATCHBOX_MODEL": "m",
        "PATCHBOX_PROVIDER_API": "chat",
        "PATCHBOX_PROVIDER_STREAM": "false",
    }


def run_step(repo: Path, server: LoopbackServer, bin_dir: Path) -> subprocess.CompletedProcess[str]:
    """The documented command, through the shell, with the repository's task copied outside
    the checkout as the step before it leaves it."""
    task_file = bin_dir.parent / "runner-temp" / "patchbox-task.json"
    task_file.parent.mkdir(exist_ok=True)
    task_file.write_bytes((repo / ".patchbox" / "task.json").read_bytes())
    return subprocess.run(
        ["sh", "-c", the_command()],
        cwd=repo,
        env={**runner_env(server, bin_dir), "TASK_FILE": str(task_file)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


PYTEST_CHECK = {
    "argv": ["python3", "-m", "pytest", "-q", "-p", "no:cacheprovider", "--junitxml=/tmp/j.xml"],
    "junit": "/tmp/j.xml",
}
