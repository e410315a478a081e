"""The service's client over real HTTP: :class:`controller.client.ServiceClient` and
``patchbox remote`` (as subprocesses) against ``patchbox serve`` on loopback; git bundle
uploads, their tenancy and size cap; bundle jobs applied to a local repository; events
resumed after a dropped connection; a bad token and an unreachable service."""

from __future__ import annotations

import functools
import json
import os
import socket
import threading
import time
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from controller.client import ServiceClient
from controller.errormap import service_error
from controller.errors import (
    ErrorCode,
    ExitCode,
    ServiceError,
    ServiceUnreachableError,
    ServiceUsageError,
    UsageError,
)
from tests.support.cli import patchbox
from tests.support.git import Repo, git_env
from tests.support.jobs import (
    make_repo,
)
from tests.support.remote import data_dir, error_of, files_for, remote, service_client
from tests.support.service import CALLS, TASK, TOKENS, serving, write_config

CAP = 64 * 1024
BAD_TOKEN = "not-the-token-4242-secret"  # noqa: S105 - a wrong one on purpose


def bundle_of(repo: Path) -> bytes:
    proc = Repo(repo, git_env()).run("bundle", "create", "-", "HEAD")
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def head_of(repo: Path) -> str:
    return Repo(repo, git_env()).head()


@pytest.fixture
def idle(tmp_path: Path) -> Any:
    """A service that queues jobs and runs none, bundles capped at 64 KiB."""
    with serving(write_config(tmp_path, workers=0, bundle_max_bytes=CAP)) as running:
        yield running


# -- without Docker ---------------------------------------------------------------------------


def test_the_client_reads_queued_jobs_and_raises_the_services_codes(
    idle: Any, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path / "alpha" / "greet")
    with service_client(idle) as alpha, service_client(idle, "beta") as beta:
        assert alpha.health() == {"status": "ok"}
        accepted = alpha.submit(TASK, repo=repo, calls=CALLS)
        job_id = accepted["job_id"]
        assert accepted["status"] == "queued"
        assert [j["job_id"] for j in alpha.jobs()] == [job_id]
        assert alpha.job(job_id)["status"] == "queued"
        assert "bundle" not in alpha.job(job_id)
        assert alpha.diff(job_id) == ""
        with pytest.raises(ServiceError) as not_finished:
            alpha.evidence(job_id)
        assert (not_finished.value.code, not_finished.value.status) == ("JOB_NOT_FINISHED", 409)
        assert not isinstance(not_finished.value, ServiceUsageError)
        for call in (beta.job, beta.diff, beta.cancel, beta.apply, beta.discard):
            with pytest.raises(ServiceUsageError) as hidden:
                call(job_id)
            assert (hidden.value.code, hidden.value.status) == (ErrorCode.NOT_FOUND, 404)
        assert beta.jobs() == []
        with pytest.raises(ServiceUsageError) as outside:
            beta.submit(TASK, repo=repo, calls=CALLS)
        assert outside.value.code is ErrorCode.REPO_NOT_ALLOWED
        with pytest.raises(ServiceUsageError) as invalid:
            alpha.submit({"prompt": ""}, repo=repo, calls=CALLS)
        assert invalid.value.code is ErrorCode.USAGE_ERROR
        assert alpha.cancel(job_id)["status"] == "cancelled"
        events = list(alpha.events(job_id))
        assert [(e.id, e.type, e.data["state"]) for e in events] == [
            (1, "state", "queued"),
            (2, "state", "cancelled"),
        ]
        assert list(alpha.events(job_id, last_event_id=1)) == events[1:]
        assert list(alpha.events(job_id, last_event_id=2)) == []
    with ServiceClient(idle.url, BAD_TOKEN) as wrong, pytest.raises(ServiceUsageError) as bad:
        wrong.jobs()
    assert bad.value.code is ErrorCode.UNAUTHORIZED
    assert BAD_TOKEN not in str(bad.value)


def test_a_service_that_does_not_answer_is_unreachable() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with (
        ServiceClient(f"http://127.0.0.1:{port}", BAD_TOKEN) as nobody,
        pytest.raises(ServiceUnreachableError) as info,
    ):
        nobody.jobs()
    assert info.value.code is ErrorCode.SERVICE_UNREACHABLE
    assert "cannot connect" in info.value.message
    assert BAD_TOKEN not in info.value.message
    for url in ("ftp://host", "no url", "http://user:pw@127.0.0.1:1"):
        with pytest.raises(UsageError):
            ServiceClient(url, BAD_TOKEN)
    with pytest.raises(UsageError):
        ServiceClient("http://127.0.0.1:1", "two words")


def test_bundles_belong_to_their_tenant_and_are_capped(idle: Any, tmp_path: Path) -> None:
    laptop = make_repo(tmp_path / "laptop" / "greet")  # outside every tenant's roots
    raw = bundle_of(laptop)
    with service_client(idle) as alpha, service_client(idle, "beta") as beta:
        uploaded = alpha.upload_bundle(raw)
        bundle_id = uploaded["bundle_id"]
        assert uploaded == {"bundle_id": bundle_id, "head": head_of(laptop), "size": len(raw)}
        with pytest.raises(ServiceUsageError) as theirs:
            beta.submit(TASK, bundle=bundle_id, calls=CALLS)
        assert (theirs.value.code, theirs.value.status) == (ErrorCode.NOT_FOUND, 404)
        for body in ({"repo": str(laptop), "bundle": bundle_id}, {"include_local_changes": True}):
            with pytest.raises(ServiceUsageError) as both:
                alpha._object(
                    "POST", "v1/jobs", "x", json={"task": TASK, "bundle": bundle_id} | body
                )
            assert both.value.code is ErrorCode.BAD_REQUEST
        job_id = alpha.submit(TASK, bundle=bundle_id, calls=CALLS)["job_id"]
        view = alpha.job(job_id)
        assert view["bundle"] == {"id": bundle_id, "head": head_of(laptop)}
        assert alpha.jobs()[0]["bundle"] == view["bundle"]
        assert alpha.jobs()[0]["repo"] == f"bundle:{bundle_id}"
        clone = data_dir(idle) / "alpha" / "clones" / job_id
        assert not clone.exists()  # checked out when the job starts, not while it is queued
        for action in (alpha.apply, alpha.revert):
            with pytest.raises(ServiceError) as no_tree:
                action(job_id)
            assert (no_tree.value.code, no_tree.value.status) == (ErrorCode.NO_WORK_TREE, 409)
            assert "patchbox remote apply" in no_tree.value.message
        assert alpha.cancel(job_id)["status"] == "cancelled"
        assert not clone.exists()
        # the bundle serves more jobs of its tenant until bundle_keep_seconds
        second = alpha.submit(TASK, bundle=bundle_id, calls=CALLS)["job_id"]
        assert alpha.cancel(second)["status"] == "cancelled"
        with pytest.raises(ServiceError) as large:
            alpha.upload_bundle(os.urandom(CAP + 1))
        assert (large.value.code, large.value.status) == (ErrorCode.BUNDLE_TOO_LARGE, 413)
        assert "bundle_max_bytes" in large.value.message
        chunks = (os.urandom(16 * 1024) for _ in range(8))  # no Content-Length: counted
        with pytest.raises(ServiceError) as streamed:
            alpha._object(
                "POST",
                "v1/bundles",
                "x",
                content=chunks,
                headers={"Content-Type": "application/octet-stream"},
            )
        assert streamed.value.code is ErrorCode.BUNDLE_TOO_LARGE
        with pytest.raises(ServiceError) as garbage:
            alpha.upload_bundle(b"# v2 git bundle\nnot really\n")
        assert (garbage.value.code, garbage.value.status) == (ErrorCode.BUNDLE_INVALID, 400)
        assert str(data_dir(idle)) not in garbage.value.message
        with pytest.raises(ServiceUsageError) as typed:
            alpha._object("POST", "v1/bundles", "x", content=raw)
        assert typed.value.code is ErrorCode.BAD_REQUEST
    left = sorted(p.name for p in (data_dir(idle) / "alpha" / "bundles").iterdir())
    assert left == [f"{bundle_id}.bundle"]


def test_remote_commands_fail_clearly_without_a_token_or_a_service(
    idle: Any, tmp_path: Path
) -> None:
    args = files_for(tmp_path / "files")
    repo = make_repo(tmp_path / "alpha" / "greet")
    missing = patchbox("remote", "jobs", "--server", idle.url, "--json", env={"PATCHBOX_TOKEN": ""})
    assert missing.returncode == ExitCode.USAGE
    assert error_of(missing)["code"] == "USAGE_ERROR"
    assert "PATCHBOX_TOKEN" in error_of(missing)["message"]
    no_server = patchbox("remote", "jobs", env={"PATCHBOX_TOKEN": "x", "PATCHBOX_SERVER": ""})
    assert no_server.returncode == ExitCode.USAGE
    assert "PATCHBOX_SERVER" in no_server.stderr
    bad = remote(idle, "submit", "--repo", str(repo), *args, "--json", token=BAD_TOKEN)
    assert bad.returncode == ExitCode.USAGE, bad.stderr
    assert error_of(bad)["code"] == "UNAUTHORIZED"
    assert BAD_TOKEN not in bad.stdout + bad.stderr
    token_file = tmp_path / "token"
    token_file.write_text(BAD_TOKEN + "\n")
    from_file = patchbox(
        "remote", "jobs", "--server", idle.url, "--token-file", str(token_file), env={}
    )
    assert from_file.returncode == ExitCode.USAGE
    assert "UNAUTHORIZED" in from_file.stderr
    assert BAD_TOKEN not in from_file.stdout + from_file.stderr
    # a repository the service cannot see: the error says to upload it
    laptop = make_repo(tmp_path / "laptop" / "greet")
    unseen = remote(idle, "submit", "--repo", str(laptop), *args)
    assert unseen.returncode == ExitCode.USAGE
    assert "REPO_NOT_ALLOWED" in unseen.stderr
    assert "--bundle" in unseen.stderr
    # a bundle over the service's cap
    (laptop / "big.bin").write_bytes(os.urandom(CAP * 2))
    Repo(laptop, git_env()).commit("big")
    large = remote(idle, "submit", "--repo", str(laptop), "--bundle", *args, "--json")
    assert large.returncode == ExitCode.FAILED, large.stderr
    assert error_of(large)["code"] == "BUNDLE_TOO_LARGE"
    # the queued job of the first call is the tenant's; another tenant's id is NOT_FOUND
    queued = remote(idle, "submit", "--repo", str(repo), *args, "--json")
    assert queued.returncode == 0, queued.stderr
    job_id = json.loads(queued.stdout)["job_id"]
    listed = remote(idle, "jobs", "--json")
    assert [j["job_id"] for j in json.loads(listed.stdout)["jobs"]] == [job_id]
    theirs = remote(idle, "show", job_id, "--json", token=TOKENS["beta"])
    assert theirs.returncode == ExitCode.USAGE
    assert error_of(theirs)["code"] == "NOT_FOUND"
    cancelled = remote(idle, "cancel", job_id, "--json")
    assert json.loads(cancelled.stdout)["status"] == "cancelled"


def test_remote_commands_say_when_the_service_does_not_answer() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    gone = patchbox(
        "remote",
        "jobs",
        "--server",
        f"http://127.0.0.1:{port}",
        env={"PATCHBOX_TOKEN": TOKENS["alpha"]},
    )
    assert gone.returncode == ExitCode.NOT_READY, gone.stderr
    assert "SERVICE_UNREACHABLE" in gone.stderr
    assert f"127.0.0.1:{port}" in gone.stderr
    assert "Traceback" not in gone.stderr
    assert TOKENS["alpha"] not in gone.stdout + gone.stderr
    started = time.monotonic()
    stream = patchbox(
        "remote",
        "events",
        "20260101-000000-dead0001",
        env={"PATCHBOX_TOKEN": TOKENS["alpha"], "PATCHBOX_SERVER": f"http://127.0.0.1:{port}"},
    )
    assert stream.returncode == ExitCode.NOT_READY, stream.stderr
    assert "SERVICE_UNREACHABLE" in stream.stderr
    assert time.monotonic() - started < 10  # no retries when it never answered


def test_an_answer_that_is_not_the_services_api_is_a_bad_response(tmp_path: Path) -> None:
    handler = functools.partial(SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        with ServiceClient(url, BAD_TOKEN) as other, pytest.raises(ServiceError) as info:
            other.jobs()
        assert (info.value.code, info.value.status) == (ErrorCode.SERVICE_BAD_RESPONSE, 404)
        assert "patchbox service" in info.value.message
        cli = patchbox("remote", "jobs", "--server", url, env={"PATCHBOX_TOKEN": BAD_TOKEN})
        assert cli.returncode == ExitCode.FAILED
        assert "SERVICE_BAD_RESPONSE" in cli.stderr
    finally:
        server.shutdown()
        server.server_close()
    unknown = service_error(418, "TEAPOT", "short and stout")
    assert (unknown.code, unknown.service_code) == (ErrorCode.SERVICE_BAD_RESPONSE, "TEAPOT")
    assert "'TEAPOT'" in unknown.message
    assert type(service_error(409, "QUOTA_EXCEEDED", "x")) is ServiceError
    assert isinstance(service_error(401, "UNAUTHORIZED", "x"), ServiceUsageError)


class CuttingProxy:
    """A loopback TCP proxy to the service that cuts the first connection whose answer holds
    an event, right after that event: a dropped event stream."""

    def __init__(self, port: int) -> None:
        self.port_upstream = port
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.cut = threading.Event()
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                downstream, _ = self.server.accept()
            except OSError:
                return
            self.connections += 1
            upstream = socket.create_connection(("127.0.0.1", self.port_upstream))
            threading.Thread(
                target=self._pump, args=(downstream, upstream, False), daemon=True
            ).start()
            threading.Thread(
                target=self._pump, args=(upstream, downstream, True), daemon=True
            ).start()

    def _pump(self, src: socket.socket, dst: socket.socket, answers: bool) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
                if answers and b"event: " in data and not self.cut.is_set():
                    self.cut.set()
                    break
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def close(self) -> None:
        self.server.close()


def test_events_resume_after_a_dropped_connection(idle: Any, tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "alpha" / "greet")
    proxy = CuttingProxy(int(idle.url.rsplit(":", 1)[1]))
    try:
        with service_client(idle) as direct:
            job_id = direct.submit(TASK, repo=repo, calls=CALLS)["job_id"]

            def cancel_later() -> None:
                assert proxy.cut.wait(30)
                time.sleep(0.5)
                direct.cancel(job_id)

            canceller = threading.Thread(target=cancel_later)
            canceller.start()
            with ServiceClient(f"http://127.0.0.1:{proxy.port}", TOKENS["alpha"]) as via:
                seen = [(e.id, e.data["state"]) for e in via.events(job_id)]
            canceller.join()
        assert proxy.cut.is_set()
        assert proxy.connections >= 2
        assert seen == [(1, "queued"), (2, "cancelled")]
    finally:
        proxy.close()


def test_remote_commands_take_a_unique_prefix_or_last(idle: Any, tmp_path: Path) -> None:
    """As ``show`` takes a local job: the full id, ``last`` (the tenant's newest), or a
    prefix naming one of the tenant's jobs; several is ``USAGE_ERROR`` naming them, none
    the service's ``NOT_FOUND``; a reference that is no path segment is refused; another
    tenant's jobs are not looked at."""
    repo = make_repo(tmp_path / "alpha" / "greet")
    with service_client(idle) as alpha:
        first = alpha.submit(TASK, repo=repo, calls=CALLS)["job_id"]
        second = alpha.submit(TASK, repo=repo, calls=CALLS)["job_id"]

    def shown(ref: str, token: str | None = None) -> tuple[int, dict[str, Any]]:
        proc = remote(idle, "show", ref, "--json", token=token)
        return proc.returncode, json.loads(proc.stdout)

    assert shown("last")[1]["job_id"] == second
    assert shown(first)[1]["job_id"] == first
    common = next(
        (first[:i] for i in range(len(first)) if first[i] != second[i]), first
    )  # the longest prefix both share
    for job_id in (first, second):
        unique = job_id[: len(common) + 1]
        assert shown(unique)[1]["job_id"] == job_id
    code, data = shown(common)
    assert (code, data["error"]["code"]) == (2, "USAGE_ERROR")
    assert f"names 2 jobs ({first}, {second})" in data["error"]["message"]
    code, data = shown("zzz")  # no job starts with it: the service's own answer
    assert data["error"]["code"] == "NOT_FOUND"
    for bad in ("..", "a/b", "x?y"):
        code, data = shown(bad)
        assert data["error"]["code"] == "USAGE_ERROR", bad
    code, data = shown("last", token=TOKENS["beta"])
    assert (code, data["error"]["code"]) == (2, "USAGE_ERROR")
    assert "has no job on the service" in data["error"]["message"]


def test_remote_submit_takes_the_repository_the_current_folder_is_in(
    idle: Any, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path / "alpha" / "greet")
    (repo / "pkg").mkdir()
    proc = patchbox(
        "remote", "submit", *files_for(tmp_path / "files"), "--server", idle.url, "--json",
        env={"PATCHBOX_TOKEN": TOKENS["alpha"]}, cwd=repo / "pkg",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    job_id = json.loads(proc.stdout)["job_id"]
    with service_client(idle) as alpha:
        assert alpha.job(job_id)["status"] == "queued"
        assert [j["repo"] for j in alpha.jobs()] == [str(repo.resolve())]
