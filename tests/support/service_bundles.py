"""Helpers of tests/unit/service/test_bundles.py and tests/docker/service/test_bundles.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from tests.support.git import Repo
from tests.support.service import (
    TASK,
)


def bundle_of(repo: Repo, *config: str) -> bytes:
    proc = repo.run(*config, "bundle", "create", "-", "HEAD")
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def upload(client: httpx.Client, raw: bytes) -> httpx.Response:
    headers = {"Content-Type": "application/octet-stream"}
    return client.post("/v1/bundles", content=raw, headers=headers)


def submit_bundle(client: httpx.Client, bundle_id: str, **extra: Any) -> httpx.Response:
    return client.post("/v1/jobs", json={"bundle": bundle_id, "task": TASK, **extra})


def data_dir(running: Any) -> Path:
    return Path(running.service.config.data_path())
