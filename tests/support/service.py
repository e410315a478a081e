"""The service for its tests: a configuration file with tenants, and the app on uvicorn in
a thread on a free loopback port."""

from __future__ import annotations

import hashlib
import json
import socket
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from controller.config.task import TaskSpec
from controller.service.app import build
from controller.service.server import server_config
from controller.service.state import Service
from controller.service.store import StoredRequest
from tests.support.jobs import EDIT, GREET

LIMITS = {"memory_mb": 512, "workspace_mb": 64, "tmp_mb": 32, "wall_seconds": 120}
TASK: dict[str, Any] = {
    "prompt": "Capitalize the greeting.",
    "checks": {"greet": GREET},
    "limits": LIMITS,
}
"""The greeting job every service test sends, with :data:`CALLS` (one edit)."""
CALLS: dict[str, Any] = {"turns": [[{"id": "c1", **EDIT}]], "final": "done"}
SLOW_CALLS: dict[str, Any] = {
    "turns": [[{"id": "c1", "name": "run_check", "arguments": {"checkId": "slow"}}]],
    "final": "done",
}
"""Runs :func:`slow_task`'s check as a tool call: the job stays running that long."""


def slow_task(seconds: int) -> dict[str, Any]:
    """A task whose only check sleeps ``seconds``."""
    return {
        "prompt": "Wait.",
        "checks": {"slow": {"argv": ["sleep", str(seconds)], "timeout_seconds": seconds + 30}},
        "baseline_checks": False,  # it holds as a tool call only
        "limits": LIMITS,
    }


END = {"awaiting_review", "failed", "cancelled", "no_change", "applied"}
"""The states a service job stays in once its run ended."""

TOKENS = {
    "alpha": "alpha-token-0123456789",
    "beta": "beta-token-9876543210",
    "gamma": "gamma-token-1357924680",
    "delta": "delta-token-2468013579",
}
"""Each tenant's bearer token; :func:`write_config` configures ``alpha`` and ``beta`` unless
told which (``tenant_names``)."""
METRICS_TOKEN = "operator-metrics-token-5555"  # noqa: S105 - the tests' operator token


def write_config(
    folder: Path,
    *,
    workers: int = 2,
    allow_apply: bool = True,
    max_queued_jobs: int = 10,
    bundle_max_bytes: int | None = None,
    service: Mapping[str, float | list[str]] | None = None,
    tenant: Mapping[str, int] | None = None,
    runtime: str | None = None,
    host: str = "",
    tenants: dict[str, str] | None = None,
    postgres: str | None = None,
    tenant_names: Sequence[str] = ("alpha", "beta"),
) -> Path:
    """A host configuration (no spare sandboxes) with tenants ``alpha`` and ``beta``, their
    repository roots ``folder/alpha`` and ``folder/beta``, the operator's metrics token
    :data:`METRICS_TOKEN`; ``bundle_max_bytes`` and the sandbox ``runtime`` when given, and
    more keys of the ``[service]`` table (``service``) and of each tenant (``tenant``).
    ``host`` is more of the host configuration (TOML before ``[service]``); ``tenants`` more
    of a tenant's table by its name (its keys, then any sub-table). ``postgres``: the
    store is that PostgreSQL database (its URL) instead of a SQLite file in ``folder``.
    ``tenant_names``: the tenants, of :data:`TOKENS` (more than ``alpha`` and ``beta``:
    ``gamma`` and ``delta``, each with its root ``folder/NAME``)."""
    lines = [
        "spare_sandboxes = 0",
        *([f'runtime = "{runtime}"'] if runtime else []),
        host,
        "[service]",
        *(
            ['state = "postgres"', f'database = "{postgres}"']
            if postgres
            else [f'database = "{folder / "service.db"}"']
        ),
        f"workers = {workers}",
        f'metrics_token_sha256 = "{hashlib.sha256(METRICS_TOKEN.encode()).hexdigest()}"',
    ]
    if bundle_max_bytes is not None:
        lines.append(f"bundle_max_bytes = {bundle_max_bytes}")
    lines += [f"{key} = {json.dumps(value)}" for key, value in (service or {}).items()]
    for name in tenant_names:
        token = TOKENS[name]
        root = folder / name
        root.mkdir(parents=True, exist_ok=True)
        lines += [
            "[[service.tenants]]",
            f'name = "{name}"',
            f'token_sha256 = "{hashlib.sha256(token.encode()).hexdigest()}"',
            f'repo_roots = ["{root}"]',
            "max_concurrent_jobs = 2",
            f"max_queued_jobs = {max_queued_jobs}",
            f"allow_apply = {'true' if allow_apply and name == 'alpha' else 'false'}",
            *(f"{key} = {value}" for key, value in (tenant or {}).items()),
            (tenants or {}).get(name, ""),
        ]
    path = folder / "config.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


@dataclass
class Running:
    url: str
    service: Service

    def client(self, tenant: str | None = "alpha") -> httpx.Client:
        headers = {"Authorization": f"Bearer {TOKENS[tenant]}"} if tenant else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)


@contextmanager
def serving(config: Path, shutdown_timeout: float = 60.0) -> Iterator[Running]:
    """The service of ``config`` on a free port; stopped (as by SIGTERM) on exit."""
    app, service = build(config, shutdown_timeout=shutdown_timeout)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(
        server_config(
            app, service.config, log_level="warning", lifespan="on", timeout_graceful_shutdown=5
        )
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            msg = "the service did not start"
            raise RuntimeError(msg)
        time.sleep(0.05)
    try:
        yield Running(f"http://127.0.0.1:{port}", service)
    finally:
        server.should_exit = True
        thread.join(timeout=120)
        sock.close()


def events(client: httpx.Client, job_id: str, last: int | None = None) -> list[dict[str, Any]]:
    """Every event of a job's stream (which ends when the job no longer runs)."""
    headers = {"Last-Event-ID": str(last)} if last is not None else {}
    out: list[dict[str, Any]] = []
    current: dict[str, Any] = {}
    with client.stream(
        "GET", f"/v1/jobs/{job_id}/events", headers=headers, timeout=300
    ) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if not line:
                if current:
                    out.append(current)
                current = {}
            elif line.startswith("id: "):
                current["id"] = int(line[4:])
            elif line.startswith("event: "):
                current["type"] = line[7:]
            elif line.startswith("data: "):
                current["data"] = json.loads(line[6:])
    return out


def wait_status(
    client: httpx.Client, job_id: str, wanted: set[str], timeout: float = 240
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        view: dict[str, Any] = client.get(f"/v1/jobs/{job_id}").json()
        if view["status"] in wanted or time.monotonic() > deadline:
            return view
        time.sleep(0.2)


def stored(**fields: str) -> StoredRequest:
    """A stored job request with a one-line task, for tests of the queue."""
    return StoredRequest(task=TaskSpec(prompt="queued"), **fields)  # type: ignore[arg-type]
