"""``patchbox demo``: one full job on the bundled example, driven by the scripted provider.

The example (``calc``) is copied into a fresh git repository under ``$PATCHBOX_HOME/demo``.
The job searches, reads, edits and runs the pytest suite in the sandbox; the diff comes
back, is validated, and the required check runs again in a fresh sandbox. The job stops
at ``awaiting_review``: the output says how to apply it and how to revert it.
"""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from pathlib import Path
from typing import TypedDict

from controller import api
from controller.config.host import HostConfig
from controller.jobs.evidence import relative_to_home
from controller.jobs.store import JobStore
from controller.paths import patchbox_home
from controller.providers import parse_calls
from controller.repo.git import GitContext, run_git
from controller.sandbox.base import Runtime
from controller.sandbox.dockerclient import connect
from controller.sandbox.image import Progress
from controller.signals import cancel_on_signals

EXAMPLE = Path(__file__).resolve().parent / "example"

TASK = {
    "prompt": "parse_items must return [] for empty or blank input; the tests say so.",
    "allowed_paths": ["calc/parser.py"],
    "checks": {
        "tests": {"argv": ["python3", "-m", "pytest", "-q", "-p", "no:cacheprovider"]},
    },
    "mode": "review",
    "limits": {"memory_mb": 512, "workspace_mb": 64, "wall_seconds": 300},
}

CALLS = {
    "turns": [
        [{"id": "c1", "name": "search_text", "arguments": {"query": "def parse_items"}}],
        [{"id": "c2", "name": "read_file", "arguments": {"path": "calc/parser.py"}}],
        [{"id": "c3", "name": "run_check", "arguments": {"checkId": "tests"}}],
        [
            {
                "id": "c4",
                "name": "replace_text",
                "arguments": {
                    "path": "calc/parser.py",
                    "oldText": '    return [item.strip() for item in text.split(",")]',
                    "newText": "    if not text.strip():\n        return []\n"
                    '    return [item.strip() for item in text.split(",")]',
                },
            }
        ],
        [{"id": "c5", "name": "run_check", "arguments": {"checkId": "tests"}}],
    ],
    "final": "parse_items returns [] for empty or blank input; the tests pass.",
}


def example_archive(root: Path = EXAMPLE) -> bytes:
    """A tar of the example tree with normalised owners, times and modes (for benchmarks
    that load a workspace without a repository)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path in sorted(root.rglob("*")):
            if "__pycache__" in path.parts:
                continue
            info = tar.gettarinfo(str(path), arcname=path.relative_to(root).as_posix())
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = 0
            if path.is_file():
                with path.open("rb") as fh:
                    tar.addfile(info, fh)
            else:
                tar.addfile(info)
    return buf.getvalue()


def make_demo_repo(root: Path) -> Path:
    """A fresh git repository holding the example, one commit."""
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(EXAMPLE, root, ignore=shutil.ignore_patterns("__pycache__"))
    ctx = GitContext(cwd=root, home=root.parent)
    run_git(ctx, "init", "-q")
    run_git(ctx, "add", "-A")
    run_git(ctx, "commit", "-q", "-m", "calc: a list parser")
    return root


class DemoResult(TypedDict):
    """The demo job, as ``patchbox demo`` shows it; the records are their JSON objects."""

    job_id: str
    status: str
    error: dict[str, object] | None
    repo: str
    runtime: str
    diff: str
    tool_calls: list[dict[str, object]]
    checks: list[dict[str, object]]
    check_changes: list[dict[str, object]]
    """The required checks before and after the change (the tests fail before: ``fixed``)."""
    timings_ms: dict[str, int]
    evidence: str
    next: list[str]


def run_demo(progress: Progress, runtime: Runtime = "runc") -> DemoResult:
    """Runs the demo job through the engine's surface, as any front door does."""
    client = connect()
    api.settle(client)
    repo = make_demo_repo(patchbox_home() / "demo" / "calc")
    progress("demo repository ready (the example package, one commit)")
    config = HostConfig()
    task = api.task_from(TASK)
    choice = api.choose_provider(config, task, parse_calls(json.dumps(CALLS)))
    request = api.JobRequest(
        repo=repo, task=task, provider=choice.provider, config=config, runtime=runtime
    )
    job = api.make_job(request, client=client, progress=progress)
    try:
        with cancel_on_signals(job.cancel, progress):
            record = job.run()
    finally:
        client.close()
    evidence = relative_to_home(JobStore().folder(record.job_id) / "evidence.json")
    view = api.job_view(record, job.diff, evidence)
    return {
        "job_id": view.job_id,
        "status": view.status,
        "error": view.error.model_dump(mode="json") if view.error else None,
        "repo": str(repo),
        "runtime": runtime,
        "diff": view.diff,
        "tool_calls": [c.model_dump(mode="json") for c in view.tool_calls],
        "checks": [c.model_dump(mode="json") for c in record.checks],
        "check_changes": [
            c.model_dump(mode="json")
            for c in (record.decision.check_changes or [] if record.decision else [])
        ],
        "timings_ms": record.timings_ms,
        "evidence": evidence,
        "next": [
            f"patchbox show {record.job_id} --diff",
            f"patchbox apply {record.job_id}",
            f"patchbox revert {record.job_id}",
        ],
    }
