"""Whole jobs for the engine, CLI, lifecycle and attack tests: the greeting project in a real
repository, task and scripted-provider builders, tool calls, and what a finished job left."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import docker

from controller.config.host import HostConfig
from controller.config.task import TaskSpec
from controller.jobs.engine import Job
from controller.jobs.records import JobRecord
from controller.jobs.request import JobRequest
from controller.jobs.store import JobStore
from controller.providers import ScriptedProvider, parse_calls
from controller.providers.base import Provider
from controller.sandbox.labels import JOB
from tests.support.git import init

APP = 'def greet(name):\n    return "hello " + name\n'
APP_AFTER = 'def greet(name):\n    return "Hello " + name\n'
CHECK = "import sys\nfrom app import greet\nsys.exit(0 if greet('x') == 'Hello x' else 1)\n"
README = "# demo\n"
NOTES = "old notes\n"
REQUIREMENTS = "requests==2.31.0\n"
FILES = {
    "app.py": APP,
    "check.py": CHECK,
    "README.md": README,
    "notes.txt": NOTES,
    "requirements.txt": REQUIREMENTS,
}

GREET = {"argv": ["python3", "check.py"], "timeout_seconds": 60}
EDIT: dict[str, Any] = {
    "name": "replace_text",
    "arguments": {"path": "app.py", "oldText": '"hello "', "newText": '"Hello "'},
}
NO_SPARES = HostConfig(spare_sandboxes=0)


def make_repo(root: Path, files: dict[str, str] | None = None) -> Path:
    """A fresh repository with one commit of ``files`` (default: the greeting project)."""
    return init(root, files or FILES, message="greet").path


def blob(text: str) -> str:
    return hashlib.sha1(f"blob {len(text.encode())}\0".encode() + text.encode()).hexdigest()  # noqa: S324 - git's object id


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def snapshot(root: Path) -> dict[str, str]:
    """Every entry under ``root`` (``.git`` included): type, mode and content hash."""
    out: dict[str, str] = {}
    for folder, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            path = Path(folder) / name
            info = path.lstat()
            rel = path.relative_to(root).as_posix()
            if stat.S_ISLNK(info.st_mode):
                out[rel] = "link:" + str(path.readlink())
            elif stat.S_ISDIR(info.st_mode):
                out[rel] = f"dir:{info.st_mode:o}"
            else:
                out[rel] = f"{info.st_mode:o}:{hashlib.sha256(path.read_bytes()).hexdigest()}"
    return out


def make_task(
    checks: dict[str, Any] | None = None,
    mode: str = "review",
    allowed_paths: list[str] | None = None,
    limits: dict[str, int] | None = None,
    *,
    baseline_checks: bool = True,
) -> TaskSpec:
    """A task; ``baseline_checks`` false runs no check before the first model turn (for a
    check that holds, or fails both before and after, where the test is about the after)."""
    data: dict[str, Any] = {
        "prompt": "Capitalize the greeting.",
        "checks": {"greet": GREET} if checks is None else checks,
        "mode": mode,
        "baseline_checks": baseline_checks,
        "limits": {"memory_mb": 512, "workspace_mb": 64, "tmp_mb": 32, "wall_seconds": 120}
        | (limits or {}),
    }
    if allowed_paths is not None:
        data["allowed_paths"] = allowed_paths
    return TaskSpec.model_validate(data)


def scripted(*turns: list[dict[str, Any]], final: str = "done") -> ScriptedProvider:
    return ScriptedProvider(parse_calls(json.dumps({"turns": list(turns), "final": final})))


def call(call_id: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"id": call_id, **spec}


def patch_call(call_id: str, patch: str) -> dict[str, Any]:
    return {"id": call_id, "name": "apply_patch", "arguments": {"patch": patch}}


def check_call(call_id: str, check_id: str) -> dict[str, Any]:
    return {"id": call_id, "name": "run_check", "arguments": {"checkId": check_id}}


def search_call(call_id: str) -> dict[str, Any]:
    return {"id": call_id, "name": "search_text", "arguments": {"query": "def greet"}}


def new_job(
    client: docker.DockerClient,
    repo: Path,
    task: TaskSpec,
    provider: Provider,
    *,
    progress: Callable[[str], None] | None = None,
    **fields: Any,
) -> Job:
    fields.setdefault("config", NO_SPARES)
    request = JobRequest(repo=repo, task=task, provider=provider, **fields)
    return Job(client, request, progress=progress)


def containers_of(client: docker.DockerClient, job_id: str) -> list[str]:
    # A sparse listing: a full one inspects each container after listing it, and one removed in
    # between (the job tearing down while this polls) raises NotFound.
    found = client.containers.list(all=True, filters={"label": f"{JOB}={job_id}"}, sparse=True)
    return [(c.attrs.get("Names") or [""])[0].lstrip("/") for c in found]


def evidence_of(job_id: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((JobStore().folder(job_id) / "evidence.json").read_text())
    return data


def code_of(record: JobRecord) -> str | None:
    return record.error.code if record.error else None


def stored(record: JobRecord) -> dict[str, Any]:
    """The record as stored, as JSON data (what its log replays to)."""
    data: dict[str, Any] = record.model_dump(mode="json")
    return data


def states(record: JobRecord) -> list[str]:
    return [s for s, _ in record.history]
