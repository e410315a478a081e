"""The service's client against a hostile service: a real HTTP server on this host answers
crafted job views and answers of any size; the client reads no more than its bounds and
sends nothing over plain http to a host that is not loopback."""

from __future__ import annotations

import gzip
import json
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from controller.errors import (
    ErrorCode,
    ExitCode,
    ServiceError,
)
from controller.service.client import MAX_ANSWER_BYTES, MAX_EVENT_BYTES, ServiceClient
from tests.support.cli import patchbox
from tests.support.git import Repo, init
from tests.support.jobs import FILES, snapshot

TOKEN = "hostile-test-token-0123456789"  # noqa: S105 - the test's own
JOB = "20260101-000000-0badc0de"
BUNDLE = "b" + "0" * 32
MIB = 1024 * 1024

Answer = Callable[[BaseHTTPRequestHandler], None]


class Hostile:
    """A "service" on a real HTTP server at ``host`` that answers each path as the test
    says (anything else: 404 in the service's error shape), records every path asked for,
    and counts the body bytes it managed to send."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.routes: dict[str, Answer] = {}
        self.asked: list[str] = []
        self.sent = 0
        self.lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                owner.answer(self)

            def do_POST(self) -> None:
                owner.answer(self)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                """Quiet."""

        self.httpd = ThreadingHTTPServer((host, 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def answer(self, handler: BaseHTTPRequestHandler) -> None:
        with self.lock:
            self.asked.append(handler.path)
        route = self.routes.get(handler.path)
        try:
            if route is None:
                error = {"error": {"code": "NOT_FOUND", "message": "no such route"}}
                body_answer(json.dumps(error).encode(), status=404)(handler)
            else:
                route(handler)
        except OSError:
            pass  # the client stopped reading

    def wrote(self, count: int) -> None:
        with self.lock:
            self.sent += count

    def url(self, host: str | None = None) -> str:
        address, port = self.httpd.server_address[:2]
        return f"http://{host or address!s}:{port}"

    def job(self, view: dict[str, Any], diff: Answer | bytes) -> None:
        """Serves ``view`` as job :data:`JOB`, ``diff`` as its diff, and an evidence bundle
        that claims a task allowing every config path."""
        self.routes[f"/v1/jobs/{JOB}"] = body_answer(json.dumps(view).encode())
        self.routes[f"/v1/jobs/{JOB}/diff"] = (
            body_answer(diff, "text/x-diff") if isinstance(diff, bytes) else diff
        )
        claimed = {"inputs": {"task": {"prompt": "x", "allowed_paths": CLAIMED}}}
        self.routes[f"/v1/jobs/{JOB}/evidence"] = body_answer(json.dumps(claimed).encode())

    def __enter__(self) -> Hostile:
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)


CLAIMED = [".github", ".gitattributes", ".env", ".envrc", "Makefile", "passwd", "app.py", "x"]
"""What the hostile service says the job's task allows: everything the attacks write."""


def body_answer(
    body: bytes, content_type: str = "application/json", *, status: int = 200
) -> Answer:
    def answer(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(status)
        handler.send_header("Content-Type", content_type)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    return answer


def endless_answer(server: Hostile, total: int, *, declared: bool, line: bytes = b"+x\n") -> Answer:
    """``total`` bytes of ``line`` repeated, in 1 MiB writes, with or without a
    Content-Length (without one the body ends when the connection closes)."""
    chunk = line * (MIB // len(line))

    def answer(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "text/x-diff")
        if declared:
            handler.send_header("Content-Length", str(total))
        handler.end_headers()
        left = total
        while left > 0:
            part = chunk[: min(left, len(chunk))]
            handler.wfile.write(part)
            server.wrote(len(part))
            left -= len(part)

    return answer


def view_of(head: str, **extra: Any) -> dict[str, Any]:
    """A bundle job's view as the service shows it, with the hostile service's claims."""
    return {
        "job_id": JOB,
        "status": "awaiting_review",
        "error": None,
        "files": [],
        "checks": [],
        "tool_calls": [],
        "evidence": "",
        "decision": {},
        "diff": "",
        "bundle": {"id": BUNDLE, "head": head},
        "task": {"allowed_paths": CLAIMED},
        "allowed_paths": CLAIMED,
    } | extra


def remote_apply(
    server: str, repo: Path, *args: str, job: str = JOB
) -> subprocess.CompletedProcess[str]:
    return patchbox(
        "remote",
        "apply",
        job,
        "--repo",
        str(repo),
        "--server",
        server,
        "--json",
        *args,
        env={"PATCHBOX_TOKEN": TOKEN},
    )


def error_of(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(proc.stdout)["error"]
    return data


@pytest.fixture
def laptop(tmp_path: Path) -> Repo:
    """The user's repository: the greeting project, one commit, clean."""
    return init(tmp_path / "laptop", FILES, message="greet")


@pytest.fixture
def hostile() -> Iterator[Hostile]:
    with Hostile() as server:
        yield server


def non_loopback_address() -> str:
    """An address of this host that is not loopback (the one its default route uses)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("192.0.2.1", 9))  # no packet is sent for a UDP connect
        address = str(probe.getsockname()[0])
    assert not address.startswith("127."), address
    return address


def test_plain_http_to_a_host_that_is_not_loopback_is_refused(laptop: Repo) -> None:
    address = non_loopback_address()
    with Hostile("0.0.0.0") as exposed:  # noqa: S104 - reachable on that address
        exposed.job(view_of(laptop.head()), b"")
        url = exposed.url(address)
        before = snapshot(laptop.path)
        refused = remote_apply(url, laptop.path)
        assert refused.returncode == ExitCode.USAGE, refused.stderr
        error = error_of(refused)
        assert error["code"] == "USAGE_ERROR"
        assert "--allow-insecure-http" in error["message"]
        assert address in error["message"]
        assert exposed.asked == []  # not one request: the token never left
        assert TOKEN not in refused.stdout + refused.stderr
        for command in ("jobs", "show"):
            args = ["remote", command, *([JOB] if command == "show" else [])]
            other = patchbox(*args, "--server", url, env={"PATCHBOX_TOKEN": TOKEN})
            assert other.returncode == ExitCode.USAGE, other.stderr
        assert exposed.asked == []
        # allowed explicitly, it is asked (and the empty diff is nothing to apply)
        allowed = remote_apply(url, laptop.path, "--allow-insecure-http")
        assert error_of(allowed)["code"] == "USAGE_ERROR"
        assert "empty diff" in error_of(allowed)["message"]
        assert exposed.asked == [f"/v1/jobs/{JOB}", f"/v1/jobs/{JOB}/diff"]
        assert snapshot(laptop.path) == before
    for fine in ("http://127.0.0.1:1", "http://localhost:1", "http://[::1]:1", "https://x:1"):
        ServiceClient(fine, TOKEN).close()


# -- what the client reads of any answer --------------------------------------------------------


def test_every_answer_is_read_within_its_bound(hostile: Hostile) -> None:
    over = 2 * MAX_ANSWER_BYTES
    hostile.routes["/v1/jobs"] = endless_answer(hostile, over, declared=False, line=b" ")
    hostile.routes[f"/v1/jobs/{JOB}"] = endless_answer(hostile, over, declared=True, line=b" ")
    huge_error = b'{"error": {"code": "NOT_FOUND", "message": "' + b"x" * (1 * MIB) + b'"}}'
    hostile.routes[f"/v1/jobs/{JOB}/evidence"] = body_answer(huge_error, status=404)
    packed = gzip.compress(json.dumps({"job_id": JOB, "status": "cancelled"}).encode())

    def compressed(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Encoding", "gzip")
        handler.send_header("Content-Length", str(len(packed)))
        handler.end_headers()
        handler.wfile.write(packed)

    hostile.routes[f"/v1/jobs/{JOB}/cancel"] = compressed
    line = b"data: " + b"x" * (MAX_EVENT_BYTES + 10)
    hostile.routes[f"/v1/jobs/{JOB}/events"] = body_answer(
        b"id: 1\nevent: state\n" + line + b"\n\n", "text/event-stream"
    )
    with ServiceClient(hostile.url(), TOKEN) as client:
        with pytest.raises(ServiceError) as listed:
            client.jobs()
        assert listed.value.code is ErrorCode.SERVICE_BAD_RESPONSE
        assert f"over {MAX_ANSWER_BYTES} bytes" in listed.value.message
        assert hostile.sent < MAX_ANSWER_BYTES + 16 * MIB  # it stopped reading there
        with pytest.raises(ServiceError) as shown:
            client.job(JOB)
        assert shown.value.code is ErrorCode.SERVICE_BAD_RESPONSE
        with pytest.raises(ServiceError) as error:
            client.evidence(JOB)
        assert error.value.code is ErrorCode.SERVICE_BAD_RESPONSE
        assert "not its error shape" in error.value.message
        assert len(error.value.message) < 1000
        with pytest.raises(ServiceError) as packed_error:
            client.cancel(JOB)
        assert "compressed (gzip)" in packed_error.value.message
        with pytest.raises(ServiceError) as event:
            list(client.events(JOB))
        assert f"a line over {MAX_EVENT_BYTES} bytes" in event.value.message
