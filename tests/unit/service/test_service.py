"""``patchbox serve``: the HTTP service over real HTTP (uvicorn in a thread, httpx):
authentication, tenant isolation, repository roots, quotas, the fair queue, restarts, a
whole job with its event stream, apply and revert, cancel, shutdown, metrics, OpenAPI."""

from __future__ import annotations

import hashlib
import json
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from controller.cli.parser import build_parser
from controller.errors import UsageError
from controller.jobs.store import INTERRUPTED_MESSAGE
from controller.paths import patchbox_home
from controller.providers.config import ENV_NAMES
from controller.service.app import ROUTES
from controller.service.config import load_service_config
from controller.service.openapi import document
from controller.service.policy import host_config_for
from controller.service.runner import Runner
from controller.service.runner import Running as RunningJob
from controller.service.sqlitestore import SqliteStore
from controller.service.store import JobRow
from tests.support.jobs import make_repo
from tests.support.paths import REPO_ROOT
from tests.support.service import (
    CALLS,
    METRICS_TOKEN,
    TOKENS,
    events,
    serving,
    stored,
    write_config,
)
from tests.support.service_http import JOB_ACTIONS, JOB_PATHS, error_of, submit

ROOT = REPO_ROOT


# -- without Docker: a service that queues and runs nothing (workers = 0) -----------------


@pytest.fixture
def idle(tmp_path: Path) -> Any:
    with serving(write_config(tmp_path, workers=0, max_queued_jobs=2)) as running:
        yield running


def test_health_metrics_and_the_openapi_document(idle: Any) -> None:
    anonymous = idle.client(None)
    assert anonymous.get("/healthz").json() == {"status": "ok"}
    served = anonymous.get("/openapi.json").json()
    assert served == json.loads((ROOT / "docs" / "openapi.json").read_text())
    assert (ROOT / "docs" / "openapi.json").read_text() == document()
    assert {path for path, *_ in ROUTES} == set(served["paths"])
    alpha = idle.client("alpha")
    repo = idle_repo(idle, "alpha")
    assert submit(alpha, repo, calls=CALLS).status_code == 202
    assert submit(idle.client("beta"), idle_repo(idle, "beta"), calls=CALLS).status_code == 202
    text = anonymous.get("/metrics").text
    assert 'patchbox_service_jobs{state="queued"} 2' in text
    assert "\npatchbox_service_queue_length 2\n" in text
    assert "\npatchbox_service_running_jobs 0\n" in text
    assert (
        'patchbox_service_http_requests_total{method="POST",route="/v1/jobs",status="202"} 2'
        in text
    )
    assert "tenant=" not in text  # no tenant's name without the operator's token
    assert "alpha" not in text
    assert "beta" not in text
    operator = anonymous.get("/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"})
    assert operator.status_code == 200
    assert 'patchbox_service_queue_length{tenant="alpha"} 1' in operator.text
    assert 'patchbox_service_queue_length{tenant="beta"} 1' in operator.text
    assert 'patchbox_service_running_jobs{tenant="alpha"} 0' in operator.text
    for header in (f"Bearer {TOKENS['alpha']}", "Bearer nope", f"Basic {METRICS_TOKEN}"):
        refused = anonymous.get("/metrics", headers={"Authorization": header})
        assert (refused.status_code, error_of(refused)) == (401, "UNAUTHORIZED")
        assert "alpha" not in refused.text


def idle_repo(running: Any, tenant: str) -> Path:
    db = Path(running.service.config.database_path())
    return make_repo(db.parent / tenant / f"repo-{time.monotonic_ns()}")


def test_no_or_a_bad_token_is_refused(idle: Any) -> None:
    for tenant, headers in ((None, {}), ("alpha", {"Authorization": "Bearer nope"})):
        client = idle.client(tenant)
        for method, path in (
            ("GET", "/v1/jobs"),
            ("POST", "/v1/jobs"),
            ("GET", "/v1/jobs/x"),
            ("GET", "/v1/jobs/x/events"),
            ("POST", "/v1/jobs/x/apply"),
        ):
            response = client.request(method, path, headers=headers)
            assert response.status_code == 401
            assert error_of(response) == "UNAUTHORIZED"
    response = idle.client(None).get("/v1/jobs", headers={"Authorization": "Basic abc"})
    assert response.status_code == 401


def test_a_tenant_never_sees_another_tenants_job(idle: Any) -> None:
    alpha, beta = idle.client("alpha"), idle.client("beta")
    accepted = submit(alpha, idle_repo(idle, "alpha"), calls=CALLS)
    assert accepted.status_code == 202
    job_id = accepted.json()["job_id"]
    assert accepted.json()["status"] == "queued"
    for path in JOB_PATHS:
        response = beta.get(f"/v1/jobs/{job_id}{path}")
        assert response.status_code == 404, path
        assert error_of(response) == "NOT_FOUND"
        assert job_id not in response.text.replace(repr(job_id), "")
    for path in JOB_ACTIONS:
        response = beta.post(f"/v1/jobs/{job_id}{path}")
        assert response.status_code == 404, path
        assert error_of(response) == "NOT_FOUND"
    assert beta.get("/v1/jobs").json() == {"jobs": []}
    assert [j["job_id"] for j in alpha.get("/v1/jobs").json()["jobs"]] == [job_id]
    view = alpha.get(f"/v1/jobs/{job_id}").json()
    assert view["status"] == "queued"
    assert alpha.get(f"/v1/jobs/{job_id}").json() == view
    assert alpha.get(f"/v1/jobs/{job_id}/diff").text == ""
    assert error_of(alpha.get(f"/v1/jobs/{job_id}/evidence")) == "JOB_NOT_FINISHED"
    assert alpha.get(f"/v1/jobs/{job_id}/status").status_code == 404  # no such route
    # beta's job stays beta's; the queued job's cancel ends it at once
    assert alpha.post(f"/v1/jobs/{job_id}/cancel").json()["status"] == "cancelled"
    assert [e["data"]["state"] for e in events(alpha, job_id)] == ["queued", "cancelled"]


def test_a_repository_outside_the_tenants_roots_is_refused(idle: Any, tmp_path: Path) -> None:
    alpha = idle.client("alpha")
    outside = make_repo(tmp_path / "elsewhere" / "repo")
    link = tmp_path / "alpha" / "link"
    link.symlink_to(outside, target_is_directory=True)
    betas = idle_repo(idle, "beta")
    for repo in (outside, link, betas, tmp_path / "alpha" / ".." / "elsewhere" / "repo"):
        response = submit(alpha, repo, calls=CALLS)
        assert response.status_code == 403, repo
        assert error_of(response) == "REPO_NOT_ALLOWED"
    assert alpha.get("/v1/jobs").json() == {"jobs": []}


def test_the_queue_quota_names_its_limit(idle: Any) -> None:
    alpha, beta = idle.client("alpha"), idle.client("beta")
    first = submit(alpha, idle_repo(idle, "alpha"), calls=CALLS).json()["job_id"]
    assert submit(alpha, idle_repo(idle, "alpha"), calls=CALLS).status_code == 202
    refused = submit(alpha, idle_repo(idle, "alpha"), calls=CALLS)
    assert refused.status_code == 429
    assert error_of(refused) == "QUOTA_EXCEEDED"
    assert "max_queued_jobs = 2" in refused.json()["error"]["message"]
    assert submit(beta, idle_repo(idle, "beta"), calls=CALLS).status_code == 202
    alpha.post(f"/v1/jobs/{first}/cancel")
    assert submit(alpha, idle_repo(idle, "alpha"), calls=CALLS).status_code == 202


def test_bad_requests_have_the_error_shape(idle: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENV_NAMES.values():
        monkeypatch.delenv(name, raising=False)
    alpha, beta = idle.client("alpha"), idle.client("beta")
    repo = idle_repo(idle, "alpha")
    cases = [
        (alpha.post("/v1/jobs", content=b"{nope"), 400, "BAD_REQUEST"),
        (alpha.post("/v1/jobs", json=[1]), 400, "BAD_REQUEST"),
        (alpha.post("/v1/jobs", json={"repo": str(repo)}), 400, "BAD_REQUEST"),
        (submit(alpha, repo, extra_field=1), 400, "BAD_REQUEST"),
        (submit(alpha, Path("alpha/repo")), 400, "BAD_REQUEST"),
        (submit(alpha, Path(f"{repo}\0x")), 400, "BAD_REQUEST"),
        (submit(alpha, repo, task={"prompt": ""}), 400, "USAGE_ERROR"),
        (submit(alpha, repo, calls={"turns": 3}), 400, "USAGE_ERROR"),
        (submit(alpha, repo), 400, "USAGE_ERROR"),  # no calls, no provider configured
        (alpha.post("/v1/jobs", content=b" " * (3 << 20)), 413, "BAD_REQUEST"),
        (alpha.get("/v2/nothing"), 404, "NOT_FOUND"),
        (alpha.delete("/v1/jobs"), 405, "METHOD_NOT_ALLOWED"),
        (alpha.get("/v1/jobs/x/events", headers={"Last-Event-ID": "x"}), 404, "NOT_FOUND"),
    ]
    for response, status, code in cases:
        assert (response.status_code, error_of(response)) == (status, code), response.text
    job_id = submit(beta, idle_repo(idle, "beta"), calls=CALLS).json()["job_id"]
    for action in ("apply", "revert"):
        response = beta.post(f"/v1/jobs/{job_id}/{action}")
        assert response.status_code == 403
        assert error_of(response) == "APPLY_NOT_ALLOWED"
        assert "allow_apply" in response.json()["error"]["message"]
    bad_id = beta.get(f"/v1/jobs/{job_id}/events", headers={"Last-Event-ID": "x"})
    assert (bad_id.status_code, error_of(bad_id)) == (400, "BAD_REQUEST")
    queued = beta.post(f"/v1/jobs/{job_id}/discard")
    assert (queued.status_code, error_of(queued)) == (409, "USAGE_ERROR")


def crash_reports() -> set[str]:
    folder = patchbox_home() / "crash"
    return {p.name for p in folder.iterdir()} if folder.is_dir() else set()


def test_an_unexpected_error_is_a_500_internal_error_with_a_crash_report(
    idle: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom(_tenant: str) -> list[Any]:
        msg = "boom"
        raise RuntimeError(msg)

    monkeypatch.setattr(idle.service.store, "list_jobs", boom)
    before = crash_reports()
    answer = idle.client("alpha").get("/v1/jobs")
    assert answer.status_code == 500
    assert error_of(answer) == "INTERNAL_ERROR"
    assert "crash report is crash/" in answer.json()["error"]["message"]
    assert len(crash_reports() - before) == 1


def nested(depth: int, leaf: Any = 1) -> Any:
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


def test_deep_json_and_odd_event_ids_are_400_without_a_crash_report(idle: Any) -> None:
    """200 KB of nested brackets (past Python's recursion limit), bodies nested a level past
    what the calls file allows, and Last-Event-ID values that str.isdigit takes but int does
    not: each is 400 BAD_REQUEST or USAGE_ERROR, and no crash report is written."""
    alpha = idle.client("alpha")
    repo = idle_repo(idle, "alpha")
    before = crash_reports()
    deep = b'{"repo": "' + str(repo).encode() + b'", "task": ' + b"[" * 100_000
    deep += b"]" * 100_000 + b"}"
    assert len(deep) > 200_000

    def calls(depth: int) -> dict[str, Any]:  # a body nested 6 + depth deep
        return {"turns": [[{"id": "c1", "name": "read_file", "arguments": {"x": nested(depth)}}]]}

    cases = [
        (alpha.post("/v1/jobs", content=deep), 400, "BAD_REQUEST"),
        (alpha.post("/v1/jobs", content=b"[" * 100_000), 400, "BAD_REQUEST"),
        (alpha.post("/v1/jobs", content=json.dumps(nested(66, {})).encode()), 400, "BAD_REQUEST"),
        (submit(alpha, repo, task={"prompt": "x", "checks": nested(60)}), 400, "USAGE_ERROR"),
        (submit(alpha, repo, calls=calls(60)), 400, "BAD_REQUEST"),  # one level too deep
        (alpha.post("/v1/jobs", content=b'{"task": 1, "task": 2}'), 400, "BAD_REQUEST"),
    ]
    for response, status, code in cases:
        assert (response.status_code, error_of(response)) == (status, code), response.text
    assert "nested too deeply" in cases[0][0].json()["error"]["message"]
    deepest = submit(alpha, repo, calls=calls(59))  # as deep as a calls file may be
    assert deepest.status_code == 202, deepest.text
    job_id = deepest.json()["job_id"]
    for value in (b"\xb2", b"1\xb3", b"\xd9\xa3", b"12345678901234567890", b"-1", b"1 2"):
        response = alpha.get(f"/v1/jobs/{job_id}/events", headers={"Last-Event-ID": value})
        assert (response.status_code, error_of(response)) == (400, "BAD_REQUEST"), value
        assert response.json()["error"]["message"] == "Last-Event-ID must be an event id"
    assert crash_reports() == before


def test_a_client_trickling_its_request_head_is_cut(tmp_path: Path) -> None:
    """With ``header_timeout_seconds = 2``: a head sent a byte every 0.2 s gets 408 and the
    connection closed about 2 s after it opened; a connection that sends nothing is closed
    as late; a head sent whole, or slowly within the bound, is answered; a kept-alive
    connection's next head gets its own 2 s."""
    config = write_config(tmp_path, workers=0, service={"header_timeout_seconds": 2})
    with serving(config) as running:
        port = int(running.url.rsplit(":", 1)[1])
        head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 200 + b"\r\n\r\n"
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            started = time.monotonic()
            sent = trickle(sock, head, 0.2)
            answer = read_all(sock)
            elapsed = time.monotonic() - started
        assert sent < len(head)
        assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
        body = json.loads(answer.split(b"\r\n\r\n", 1)[1])
        assert body["error"]["code"] == "BAD_REQUEST"
        assert "header_timeout_seconds" in body["error"]["message"]
        assert 1.8 < elapsed < 5, elapsed
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            started = time.monotonic()
            assert read_all(sock) == b""  # nothing sent: closed, no answer
            assert 1.8 < time.monotonic() - started < 5
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            assert trickle(sock, head[:40], 0.02) == 40  # 0.8 s, within the bound
            sock.sendall(head[40:])
            first = read_answer(sock)
            assert first.startswith(b"HTTP/1.1 200 "), first[:200]
            time.sleep(1.5)  # kept alive: the next head gets its own deadline
            sock.sendall(head)
            assert read_answer(sock).startswith(b"HTTP/1.1 200 ")
            started = time.monotonic()
            trickle(sock, head, 0.2)
            assert read_all(sock).startswith(b"HTTP/1.1 408 ")
            assert 1.8 < time.monotonic() - started < 5
        assert running.client(None).get("/healthz").json() == {"status": "ok"}


def trickle(sock: socket.socket, data: bytes, pause: float) -> int:
    """Sends ``data`` a byte at a time, ``pause`` seconds apart, until it is all sent or the
    service closes the connection; the bytes sent."""
    for n in range(len(data)):
        try:
            sock.sendall(data[n : n + 1])
        except OSError:
            return n
        if pause and select.select([sock], [], [], pause)[0]:
            return n + 1  # the service answered (or closed) before the head was done
    return len(data)


def read_all(sock: socket.socket) -> bytes:
    """Everything until the service closes the connection."""
    out = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return out
        if not chunk:
            return out
        out += chunk


def read_answer(sock: socket.socket) -> bytes:
    """One answer with a Content-Length, on a connection kept alive."""
    out = b""
    while b"\r\n\r\n" not in out:
        out += sock.recv(65536)
    head, _, body = out.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        body += sock.recv(65536)
    return head + b"\r\n\r\n" + body


def test_the_queue_is_fair_and_one_job_per_repository(tmp_path: Path) -> None:
    _host, config = load_service_config(
        write_config(tmp_path, workers=0, service={"visible_roots": ["/r"]})
    )
    store = SqliteStore(tmp_path / "fair.db")
    runner = Runner(store, _host, config)
    t = time.time()
    rows = [
        JobRow("a1", "alpha", "/r/a", stored(), "queued", t),
        JobRow("a2", "alpha", "/r/a", stored(), "queued", t + 1),
        JobRow("a3", "alpha", "/r/b", stored(), "queued", t + 2),
        JobRow("a4", "alpha", "/r/c", stored(), "queued", t + 3),
        JobRow("b1", "beta", "/r/x", stored(), "queued", t + 4),
        JobRow("b2", "beta", "/r/b", stored(), "queued", t + 5),
    ]
    for row in rows:
        store.insert_job(row)
    picked = []
    while (picked_row := runner._pick()) is not None:
        picked.append(picked_row.job_id)
        runner._running[picked_row.job_id] = RunningJob(picked_row)
        store.update_state(picked_row.job_id, "running")
    # round robin; a2 waits for a1's repository; alpha runs at most 2; b2 waits for /r/b
    assert picked == ["a1", "b1", "a3"]
    runner._running.pop("a1")
    assert runner._pick().job_id == "a2"  # type: ignore[union-attr]
    runner.shutdown(timeout=1)
    store.close()


def test_max_sandboxes_bounds_a_tenants_running_jobs_and_its_spares(tmp_path: Path) -> None:
    path = write_config(tmp_path, workers=0, service={"visible_roots": ["/r"]})
    path.write_text(
        path.read_text().replace(
            "max_concurrent_jobs = 2", "max_concurrent_jobs = 2\nmax_sandboxes = 1", 1
        )
    )
    host, config = load_service_config(path)
    alpha, beta = config.tenants
    assert (alpha.max_sandboxes, alpha.job_limit(), beta.job_limit()) == (1, 1, 2)
    store = SqliteStore(tmp_path / "sandboxes.db")
    runner = Runner(store, host, config)
    t = time.time()
    for n, (job_id, tenant) in enumerate(
        (("a1", "alpha"), ("a2", "alpha"), ("b1", "beta"), ("b2", "beta"))
    ):
        store.insert_job(JobRow(job_id, tenant, f"/r/{job_id}", stored(), "queued", t + n))
    picked = []
    while (row := runner._pick()) is not None:
        picked.append(row.job_id)
        runner._running[row.job_id] = RunningJob(row)
    assert picked == ["a1", "b1", "b2"]  # alpha: one sandbox, so one job at a time
    spares = host.model_copy(update={"spare_sandboxes": 2})
    assert (
        host_config_for(
            spares, alpha, JobRow("a", "alpha", "/r", stored(), "queued", t)
        ).spare_sandboxes
        == 0
    )
    assert (
        host_config_for(
            spares, beta, JobRow("b", "beta", "/r", stored(), "queued", t)
        ).spare_sandboxes
        == 2
    )
    bundle_row = JobRow("c", "beta", "/r", stored(bundle="b" + "0" * 32), "queued", t)
    assert host_config_for(spares, beta, bundle_row).spare_sandboxes == 0
    runner.shutdown(timeout=1)
    store.close()


def test_a_restart_marks_running_jobs_interrupted_and_keeps_the_queue(tmp_path: Path) -> None:
    config = write_config(tmp_path, workers=0, service={"visible_roots": ["/r"]})
    _host, service = load_service_config(config)
    store = SqliteStore(service.database_path())
    t = time.time()
    store.insert_job(JobRow("20260101-000000-dead0001", "alpha", "/r/a", stored(), "running", t))
    store.insert_job(JobRow("20260101-000000-wait0001", "alpha", "/r/b", stored(), "queued", t))
    store.close()
    with serving(config) as running:
        alpha = running.client("alpha")
        jobs = {j["job_id"]: j["status"] for j in alpha.get("/v1/jobs").json()["jobs"]}
        assert jobs == {"20260101-000000-dead0001": "failed", "20260101-000000-wait0001": "queued"}
        (event,) = events(alpha, "20260101-000000-dead0001")
        assert event["data"] == {
            "state": "failed",
            "reason": "INTERRUPTED",
            "error": {"code": "INTERRUPTED", "message": INTERRUPTED_MESSAGE},
        }


def test_the_service_table_is_validated(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    host, service = load_service_config(config)
    assert host.spare_sandboxes == 0
    assert [t.name for t in service.tenants] == ["alpha", "beta"]
    assert service.tenants[0].token_sha256 == hashlib.sha256(TOKENS["alpha"].encode()).hexdigest()
    bad = tmp_path / "bad.toml"
    bad.write_text(config.read_text().replace("workers = 2", "workers = 2\nthreads = 3"))
    with pytest.raises(UsageError, match="service"):
        load_service_config(bad)
    alpha_hash = hashlib.sha256(TOKENS["alpha"].encode()).hexdigest()
    metrics_hash = hashlib.sha256(METRICS_TOKEN.encode()).hexdigest()
    assert service.metrics_token_sha256 == metrics_hash
    shared = tmp_path / "shared.toml"
    shared.write_text(config.read_text().replace(metrics_hash, alpha_hash))
    with pytest.raises(UsageError, match="metrics_token_sha256 is a tenant's token_sha256"):
        load_service_config(shared)
    for key, value in (
        ("header_timeout_seconds", "0"),
        ("bundle_max_tree_entries", "0"),
        ("bundle_max_tree_bytes", "-1"),
    ):
        wrong = tmp_path / f"{key}.toml"
        wrong.write_text(config.read_text().replace("workers = 2", f"workers = 2\n{key} = {value}"))
        with pytest.raises(UsageError, match=key):
            load_service_config(wrong)
    args = build_parser().parse_args(["serve", "--config", str(config), "--port", "9"])
    assert (args.command, args.host, args.port) == ("serve", "127.0.0.1", 9)


def test_patchbox_serve_answers_and_stops_on_sigterm(tmp_path: Path) -> None:
    config = write_config(tmp_path, workers=0, service={"header_timeout_seconds": 1})
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    argv = [sys.executable, "-m", "controller", "serve", "--config", str(config)]
    process = subprocess.Popen(
        [*argv, "--port", str(port)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                answer = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)
                break
            except httpx.TransportError:
                assert process.poll() is None, process.communicate()[1][-2000:]
                assert time.monotonic() < deadline, "patchbox serve did not start"
                time.sleep(0.1)
        assert answer.json() == {"status": "ok"}
        headers = {"Authorization": f"Bearer {TOKENS['beta']}"}
        listed = httpx.get(f"http://127.0.0.1:{port}/v1/jobs", headers=headers, timeout=5)
        assert listed.json() == {"jobs": []}
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            started = time.monotonic()
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # and no more
            assert read_all(sock).startswith(b"HTTP/1.1 408 ")  # its head deadline: 1 s
            assert 0.8 < time.monotonic() - started < 4
        process.send_signal(signal.SIGTERM)
        _out, err = process.communicate(timeout=60)
        # uvicorn shuts down, then lets the signal end the process as it would have (143)
        assert process.returncode in {0, -signal.SIGTERM}, err[-2000:]
        assert b"Application shutdown complete" in err
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        if process.stderr is not None:
            process.stderr.close()
