"""``patchbox mcp``: the sandbox's tools as an MCP server, driven by the official SDK's own
client over stdio and over Streamable HTTP, and by raw JSON-RPC lines, on real repositories
and the real daemon.

- The tools are the loop's (same names and JSON Schemas), plus ``propose``; never an apply
  tool. Calls get the loop's error codes; a repeated request id runs once.
- A proposed job is applied and reverted with the CLI, on the work tree.
- The client's end (stdin's end, the client killed, an HTTP session deleted), SIGTERM, or a
  second server on the same repository: nothing keeps running, the record says why.
- The server killed with SIGKILL, over stdio or HTTP, at any moment of a session (its job
  opening, idle, a check running, ``propose``'s checks running): every sandbox of its job
  stops within ``ORPHAN_STOP_SECONDS``, and the next command marks the job ``INTERRUPTED``.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

import anyio
import docker
import pytest
from mcp.client.client import Client

from controller.config.task import CheckSpec
from controller.jobs.records import JobRecord
from controller.jobs.store import JobStore
from controller.mcp.slot import JOB_STARTED, PROPOSE
from controller.sandbox.base import Runtime
from controller.sandbox.docker import ORPHAN_STOP_SECONDS
from controller.sandbox.labels import CONTROLLER, KIND, OWNER_FILTER
from controller.tools.schemas import tool_schemas
from tests.support.cli import patchbox
from tests.support.jobs import APP, APP_AFTER, containers_of, make_repo
from tests.support.mcp import (
    EDIT,
    LOOP_TOOLS,
    ROOT,
    TASK,
    code,
    data,
    server_args,
    stdio,
    the_job,
    until,
)

CHECKS = {cid: CheckSpec.model_validate(spec) for cid, spec in TASK["checks"].items()}
"""The session's checks, as its tool list describes them."""

DENIED, INVALID = "TOOL_PATH_DENIED", "TOOL_ARGUMENTS_INVALID"
INITIALIZE = {
    "protocolVersion": "2025-11-25",
    "capabilities": {},
    "clientInfo": {"name": "test_mcp", "version": "0"},
}


# -- helpers ------------------------------------------------------------------------------


def controller_pid(record: JobRecord) -> int:
    return int(record.controller.split(":")[1])


def gone(pid: int) -> bool:
    """The process is gone or a zombie nobody reaped yet."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


class Raw:
    """The server in a subprocess, spoken to in JSON-RPC lines: every line on its stdout
    must be a JSON-RPC message."""

    def __init__(self, args: list[str], stderr: Path) -> None:
        self.stderr_path = stderr
        self._err = stderr.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._err,
            cwd=ROOT,
            env=dict(os.environ),
            start_new_session=True,
        )
        self.lines: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.stdout: list[bytes] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        out: IO[bytes] | None = self.proc.stdout
        assert out is not None
        for line in out:
            self.stdout.append(line)
            self.lines.put(json.loads(line))
        self.lines.put(None)

    def send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps({"jsonrpc": "2.0", **message}) + "\n").encode())
        self.proc.stdin.flush()

    def response(self, request_id: int, timeout: float = 120.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            message = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            assert message is not None, "the server closed its stdout"
            if message.get("id") == request_id:
                return message

    def handshake(self) -> None:
        self.send({"id": 0, "method": "initialize", "params": INITIALIZE})
        assert "result" in self.response(0)
        self.send({"method": "notifications/initialized"})

    def call(self, request_id: int, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        self.send(self.request(request_id, name, arguments))
        result: dict[str, Any] = self.response(request_id)["result"]
        return result

    @staticmethod
    def request(request_id: int, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        params = {"name": name, "arguments": arguments}
        return {"id": request_id, "method": "tools/call", "params": params}

    def close_stdin(self) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        return self.proc.wait(timeout=60)

    def stderr(self) -> str:
        if not self._err.closed:
            self._err.flush()
        return self.stderr_path.read_text()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._err.close()


def raw_code(result: dict[str, Any]) -> str:
    assert result["isError"] is True
    assert json.loads(result["content"][0]["text"]) == result["structuredContent"]
    return str(result["structuredContent"]["error"]["code"])


# -- stdio, end to end --------------------------------------------------------------------


def test_a_stdio_session_reads_edits_checks_proposes_and_the_cli_applies_and_reverts(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    del sandbox_image
    repo = make_repo(tmp_path / "repo")
    params = stdio(server_args(tmp_path / "files", repo))

    async def scenario() -> dict[str, Any]:
        async with Client(params) as client:  # "auto": the 2026 protocol over stdio
            listed = {t.name: t for t in (await client.list_tools()).tools}
            assert list(listed) == [*LOOP_TOOLS, PROPOSE]
            for loop in tool_schemas(CHECKS):
                assert listed[loop["name"]].input_schema == loop["parameters"]
                assert listed[loop["name"]].description == loop["description"]
            check_id = listed["run_check"].input_schema["properties"]["checkId"]
            assert check_id["enum"] == ["greet"]
            line = "- greet: python3 check.py (the change must pass it; at most 60 s)"
            assert (listed["run_check"].description or "").endswith(line)
            assert line in (client.instructions or "")
            assert "Capitalize the greeting." in (client.instructions or "")
            found = data(await client.call_tool("search_text", {"query": "hello"}))
            assert [h["path"] for h in found["hits"]] == ["app.py"]
            read = data(await client.call_tool("read_file", {"path": "app.py"}))
            assert read["content"] == APP
            before = await client.call_tool("run_check", {"checkId": "greet"})
            assert not before.is_error  # the call ran; the check failed, and says so
            assert data(before)["status"] == "failed"
            assert data(before)["verdict"] == "greet: failed, exit 1"
            assert not (await client.call_tool("replace_text", EDIT)).is_error
            after = data(await client.call_tool("run_check", {"checkId": "greet"}))
            assert (after["status"], after["verdict"]) == ("passed", "greet: passed")
            proposal = await client.call_tool(PROPOSE, {"message": "capitalized"})
            assert not proposal.is_error
            assert code(await client.call_tool(PROPOSE, {})) == "USAGE_ERROR"
            late = data(await client.call_tool("list_files", {}))  # a new job
            assert late[JOB_STARTED]["job_id"] != data(proposal)["job_id"]
            return data(proposal)

    view = anyio.run(scenario)
    job_id = view["job_id"]
    assert view["status"] == "awaiting_review"
    assert {"job_id", "status", "diff", "files", "checks", "error", "decision"} <= set(view)
    assert view["apply"] == f"patchbox apply {job_id}"
    assert '+    return "Hello " + name' in view["diff"]
    assert [(f["path"], f["change"]) for f in view["files"]] == [("app.py", "modify")]
    assert [(c["id"], c["status"]) for c in view["checks"]] == [("greet", "passed")]
    assert not containers_of(docker_client, job_id)
    assert (repo / "app.py").read_text() == APP
    applied = patchbox("apply", job_id)
    assert applied.returncode == 0, applied.stderr
    assert (repo / "app.py").read_text() == APP_AFTER
    reverted = patchbox("revert", job_id)
    assert reverted.returncode == 0, reverted.stderr
    assert (repo / "app.py").read_text() == APP
    assert JobStore().load(job_id).state == "reverted"


def test_hostile_calls_get_the_loops_codes_and_the_session_goes_on(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    del sandbox_image
    repo = make_repo(tmp_path / "repo")
    params = stdio(server_args(tmp_path / "files", repo))
    huge = "x" * (2 * 1024 * 1024)

    async def scenario() -> None:
        async with Client(params, mode="legacy") as client:  # the 2025 handshake
            calls: list[tuple[str, dict[str, Any], str]] = [
                ("read_file", {"path": "../x"}, DENIED),
                ("read_file", {"path": "/etc/passwd"}, "TOOL_PATH_INVALID"),
                ("read_file", {"path": ".git/config"}, DENIED),
                ("replace_text", {"path": ".git/config", "oldText": "[", "newText": "]"}, DENIED),
                ("read_file", {"path": huge}, INVALID),
                ("replace_text", {"path": "app.py", "oldText": huge, "newText": "y"}, INVALID),
                ("list_files", {"bogus": 1}, INVALID),
                ("read_file", {"path": 5}, INVALID),
                ("run_check", {"checkId": "nope"}, INVALID),
                ("apply", {}, INVALID),
                ("no_such_tool", {}, INVALID),
            ]
            for name, arguments, expected in calls:
                result = await client.call_tool(name, arguments)
                assert code(result) == expected, (name, data(result))
            assert not (await client.call_tool("list_files", {})).is_error

    anyio.run(scenario)
    record = the_job(repo)
    assert record.state == "cancelled"
    assert not [c for c in record.tool_calls if c.ok and c.name != "list_files"]
    assert not containers_of(docker_client, record.job_id)


def test_a_repeated_request_id_runs_once_and_stdin_closing_cancels_the_job(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    del sandbox_image
    repo = make_repo(tmp_path / "repo")
    server = Raw(server_args(tmp_path / "files", repo), tmp_path / "server.err")
    try:
        server.handshake()
        first = server.call(7, "replace_text", EDIT)
        assert first["isError"] is False
        again = server.call(7, "replace_text", EDIT)
        assert again == first  # the first answer, not a second edit (which would not match)
        other = server.call(8, "replace_text", EDIT)
        assert raw_code(other) == "PATCH_REJECTED"
        record = the_job(repo)
        assert containers_of(docker_client, record.job_id)
        assert server.close_stdin() == 0, server.stderr()
    finally:
        server.close()
    record = JobStore().load(record.job_id)
    assert record.state == "cancelled"
    assert [e.tool for e in record.ledger] == ["replace_text", "replace_text"]
    assert [(c.name, c.ok) for c in record.tool_calls] == [
        ("replace_text", True),
        ("replace_text", False),
    ]
    assert not containers_of(docker_client, record.job_id)
    assert all(json.loads(line)["jsonrpc"] == "2.0" for line in server.stdout)
    assert "session closed" in server.stderr()


def test_repeated_request_ids_after_propose_get_their_first_answers(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    del sandbox_image
    repo = make_repo(tmp_path / "repo")
    server = Raw(server_args(tmp_path / "files", repo), tmp_path / "server.err")
    try:
        server.handshake()
        edit = server.call(1, "replace_text", EDIT)
        proposal = server.call(2, PROPOSE, {"message": "capitalized"})
        assert proposal["isError"] is False
        assert proposal["structuredContent"]["status"] == "awaiting_review"
        assert server.call(2, PROPOSE, {"message": "capitalized"}) == proposal
        assert server.call(1, "replace_text", EDIT) == edit
        again = server.call(3, PROPOSE, {})
        assert raw_code(again) == "USAGE_ERROR"
        first = proposal["structuredContent"]["job_id"]
        assert f"the job {first} was proposed (awaiting_review)" in str(again)
        assert "the next tool call starts a new job" in str(again)
        second = server.call(4, "replace_text", EDIT)  # a new job, on the unchanged repository
        assert second["isError"] is False
        started = second["structuredContent"][JOB_STARTED]
        assert started["job_id"] != first
        assert f"the previous job {first} awaits review" in started["message"]
        assert server.call(4, "replace_text", EDIT) == second
        assert server.close_stdin() == 0, server.stderr()
    finally:
        server.close()
    record = JobStore().load(first)
    assert record.state == "awaiting_review"
    assert [(c.name, c.ok) for c in record.tool_calls] == [("replace_text", True)]
    assert not containers_of(docker_client, record.job_id)
    newer = JobStore().load(started["job_id"])
    assert newer.state == "cancelled"
    assert [(c.name, c.ok) for c in newer.tool_calls] == [("replace_text", True)]
    assert not containers_of(docker_client, newer.job_id)


def test_sigterm_during_a_check_cancels_the_job_and_exits_143(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    del sandbox_image
    repo = make_repo(tmp_path / "repo")
    slow = {"argv": ["sh", "-c", "echo holding; sleep 120"], "timeout_seconds": 200}
    task = {**TASK, "checks": {"slow": slow}, "baseline_checks": False}
    server = Raw(server_args(tmp_path / "files", repo, task), tmp_path / "server.err")
    try:
        server.handshake()
        assert server.call(1, "list_files", {})["isError"] is False
        server.send(Raw.request(2, "run_check", {"checkId": "slow"}))
        record = the_job(repo)
        assert until(lambda: bool(JobStore().load(record.job_id).state == "running"))
        time.sleep(1.0)
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=60) == 143, server.stderr()
    finally:
        server.close()
    assert JobStore().load(record.job_id).state == "cancelled"
    assert not containers_of(docker_client, record.job_id)
    assert "stopping (SIGTERM)" in server.stderr()


CLIENT = """
import sys, anyio
from mcp import Client
from mcp.client.stdio import StdioServerParameters

async def main():
    params = StdioServerParameters.model_validate_json(sys.argv[1])
    async with Client(params) as client:
        result = await client.call_tool("read_file", {"path": "app.py"})
        print("READY" if not result.is_error else "FAILED", flush=True)
        await anyio.sleep(3600)

anyio.run(main)
"""


def test_a_killed_client_leaves_nothing_running(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    del sandbox_image
    repo = make_repo(tmp_path / "repo")
    params = stdio(server_args(tmp_path / "files", repo))
    client = subprocess.Popen(
        [sys.executable, "-c", CLIENT, params.model_dump_json()],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=ROOT,
    )
    try:
        assert client.stdout is not None
        assert client.stdout.readline().strip() == "READY"
        record = the_job(repo)
        pid = controller_pid(record)
        assert containers_of(docker_client, record.job_id)
        client.kill()  # the server is in a session of its own: it only sees stdin's end
        client.wait()
        assert until(lambda: gone(pid)), "the server outlived its client"
    finally:
        if client.poll() is None:
            client.kill()
    assert JobStore().load(record.job_id).state == "cancelled"
    assert until(lambda: not containers_of(docker_client, record.job_id), 5.0)


HOLD = {"argv": ["sh", "-c", "echo holding; sleep 120"], "timeout_seconds": 200}
HOLDING_TASK: dict[str, Any] = {**TASK, "checks": {"hold": HOLD}, "baseline_checks": False}


def sandboxes_of(client: docker.DockerClient, pid: int) -> dict[str, str]:
    """The sandboxes (no spare) a controller with process id ``pid`` started: id to state."""
    found = client.containers.list(all=True, sparse=True, filters={"label": OWNER_FILTER})
    return {
        c.id or "": c.attrs["State"]
        for c in found
        if f":{pid}:" in c.attrs["Labels"].get(CONTROLLER, "")
        and c.attrs["Labels"].get(KIND) != "spare"
    }


def kill_and_time(client: docker.DockerClient, proc: subprocess.Popen[Any]) -> float:
    """SIGKILLs the server; how long until no sandbox it started runs (fails past the
    bound)."""
    pid = proc.pid
    assert sandboxes_of(client, pid), "no sandbox to outlive the server"
    proc.kill()
    proc.wait(timeout=30)
    started = time.monotonic()
    running = until(
        lambda: "running" not in sandboxes_of(client, pid).values(), ORPHAN_STOP_SECONDS
    )
    took = time.monotonic() - started
    assert running, f"a sandbox still runs {took:.1f} s after its server was killed"
    return took


def interrupted(client: docker.DockerClient, repo: Path) -> None:
    """The next command settles the job a killed server left: INTERRUPTED, nothing left."""
    record = the_job(repo)
    listed = patchbox("jobs", "--json")
    assert listed.returncode == 0, listed.stderr
    [entry] = [j for j in json.loads(listed.stdout)["jobs"] if j["job_id"] == record.job_id]
    assert (entry["status"], entry["error"]["code"]) == ("failed", "INTERRUPTED")
    assert not containers_of(client, record.job_id)


def drive_to(server: Raw, docker_client: docker.DockerClient, moment: str) -> None:
    """Brings a stdio session to ``moment``: its job opening (its sandbox runs, the first call
    may not be answered yet), idle, a check running, or ``propose``'s checks running."""
    pid = server.proc.pid
    server.handshake()
    if moment == "opening":
        server.send(Raw.request(1, "read_file", {"path": "app.py"}))
        opening = lambda: "running" in sandboxes_of(docker_client, pid).values()  # noqa: E731
        assert until(opening, 120.0), server.stderr()
        return
    assert server.call(1, "replace_text", EDIT)["isError"] is False
    if moment == "check":
        server.send(Raw.request(2, "run_check", {"checkId": "hold"}))
        time.sleep(1.5)
    elif moment == "propose":
        first = set(sandboxes_of(docker_client, pid))
        server.send(Raw.request(2, PROPOSE, {}))

        def checking() -> bool:
            boxes = sandboxes_of(docker_client, pid)
            return any(s == "running" for c, s in boxes.items() if c not in first)

        assert until(checking, 120.0), server.stderr()
        time.sleep(1.5)


@pytest.mark.parametrize(
    ("moment", "tries"), [("opening", 3), ("idle", 1), ("check", 1), ("propose", 1)]
)
def test_a_killed_stdio_server_leaves_no_sandbox_running(
    docker_client: docker.DockerClient,
    sandbox_image: str,
    tmp_path: Path,
    runtime: Runtime,
    moment: str,
    tries: int,
) -> None:
    del sandbox_image
    for n in range(tries):
        repo = make_repo(tmp_path / f"repo{n}")
        files = tmp_path / f"files{n}"
        args = [*server_args(files, repo, HOLDING_TASK), "--runtime", runtime]
        server = Raw(args, tmp_path / f"server{n}.err")
        try:
            drive_to(server, docker_client, moment)
            took = kill_and_time(docker_client, server.proc)
        finally:
            server.close()
        print(f"{runtime} {moment}: no sandbox running {took:.2f} s after SIGKILL")
        interrupted(docker_client, repo)


def test_a_killed_http_server_leaves_no_sandbox_running(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path, runtime: Runtime
) -> None:
    """Over HTTP the sandboxes are the sessions': one session idle with its job's sandbox,
    the same job's check running when the server is killed."""
    del sandbox_image
    repo = make_repo(tmp_path / "repo")
    err_path = tmp_path / "server.err"
    args = [*server_args(tmp_path / "files", repo, HOLDING_TASK), "--runtime", runtime]
    with err_path.open("w") as err:
        server = subprocess.Popen(
            [sys.executable, *args, "--http", "0"],
            stdout=subprocess.DEVNULL,
            stderr=err,
            cwd=ROOT,
            env=dict(os.environ),
        )
        try:

            def url() -> str:
                found = re.search(r"(http://127\.0\.0\.1:\d+/mcp)", err_path.read_text())
                return found.group(1) if found else ""

            assert until(lambda: bool(url()), 60.0), err_path.read_text()

            async def scenario() -> float:
                client = Client(url())
                await client.__aenter__()
                try:
                    assert not (await client.call_tool("replace_text", EDIT)).is_error

                    async def hold() -> None:
                        with contextlib.suppress(Exception):
                            await client.call_tool("run_check", {"checkId": "hold"})

                    async with anyio.create_task_group() as tasks:
                        tasks.start_soon(hold)
                        await anyio.sleep(1.5)
                        took = await anyio.to_thread.run_sync(kill_and_time, docker_client, server)
                        tasks.cancel_scope.cancel()
                    return took
                finally:
                    with anyio.move_on_after(10), contextlib.suppress(Exception):
                        await client.__aexit__(None, None, None)

            took = anyio.run(scenario)
        finally:
            if server.poll() is None:
                server.kill()
                server.wait()
    print(f"{runtime} http: no sandbox running {took:.2f} s after SIGKILL")
    interrupted(docker_client, repo)


def test_a_second_server_on_the_same_repository_gets_job_already_running(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    del sandbox_image
    repo = make_repo(tmp_path / "repo")
    second = Raw(server_args(tmp_path / "b", repo), tmp_path / "b.err")
    third = Raw(server_args(tmp_path / "c", repo), tmp_path / "c.err")

    async def scenario() -> None:
        async with Client(stdio(server_args(tmp_path / "a", repo))) as first:
            assert not (await first.call_tool("list_files", {})).is_error
            second.handshake()
            refused = second.call(1, "read_file", {"path": "app.py"})
            assert raw_code(refused) == "JOB_ALREADY_RUNNING"
            mine = [r for r in JobStore().all() if r.repo == str(repo.resolve())]
            holder = next(r.job_id for r in mine if r.state == "running")
            message = refused["structuredContent"]["error"]["message"]
            assert (
                message
                == f"another job is already running on this repository: job {holder} holds it"
            )
            third.handshake()
            assert raw_code(third.call(1, "list_files", {})) == "JOB_ALREADY_RUNNING"
        # the first session is over: the second server's next call opens its job
        assert second.call(2, "read_file", {"path": "app.py"})["isError"] is False

    try:
        anyio.run(scenario)
        assert third.close_stdin() == 1
        assert "patchbox: error JOB_ALREADY_RUNNING" in third.stderr()
        assert second.close_stdin() == 0
        assert "patchbox: error JOB_ALREADY_RUNNING" in second.stderr()
    finally:
        second.close()
        third.close()
    records = [r for r in JobStore().all() if r.repo == str(repo.resolve())]
    states = sorted((r.state, r.error.code if r.error else None) for r in records)
    assert states == [  # the refusals left no job record
        ("cancelled", "CANCELLED"),
        ("cancelled", "CANCELLED"),
    ]
    assert all(not containers_of(docker_client, r.job_id) for r in records)


def test_an_auto_task_applies_itself_when_proposed(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    del sandbox_image
    repo = make_repo(tmp_path / "repo")
    args = server_args(tmp_path / "files", repo, {**TASK, "mode": "auto"}, "allow_auto = true\n")

    async def scenario() -> dict[str, Any]:
        async with Client(stdio(args)) as client:
            names = [t.name for t in (await client.list_tools()).tools]
            assert "apply" not in names
            assert not (await client.call_tool("replace_text", EDIT)).is_error
            return data(await client.call_tool(PROPOSE, {}))

    view = anyio.run(scenario)
    assert (view["status"], view["apply"]) == ("applied", None)
    assert (repo / "app.py").read_text() == APP_AFTER
    assert not containers_of(docker_client, view["job_id"])
    assert patchbox("revert", view["job_id"]).returncode == 0
    assert (repo / "app.py").read_text() == APP


# -- HTTP ---------------------------------------------------------------------------------


async def http_sessions(url: str, repo: str) -> tuple[dict[str, Any], str]:
    """One session proposes, one ends unproposed, one without a session is refused."""
    async with Client(url) as client:  # "auto" falls back to the handshake
        assert client.protocol_version == "2025-11-25"
        listed = {t.name: t.input_schema for t in (await client.list_tools()).tools}
        assert listed == {
            **{t["name"]: t["parameters"] for t in tool_schemas(CHECKS)},
            PROPOSE: listed[PROPOSE],
        }
        read = data(await client.call_tool("read_file", {"path": "app.py"}))
        assert read["content"] == APP
        escape = await client.call_tool("read_file", {"path": "../x"})
        assert code(escape) == "TOOL_PATH_DENIED"
        failing = data(await client.call_tool("run_check", {"checkId": "greet"}))
        assert failing["status"] == "failed"
        assert not (await client.call_tool("replace_text", EDIT)).is_error
        passing = data(await client.call_tool("run_check", {"checkId": "greet"}))
        assert passing["status"] == "passed"
        proposal = data(await client.call_tool(PROPOSE, {"message": "capitalized"}))
    async with Client(url) as client:  # a new session, a new job; ends unproposed
        assert not (await client.call_tool("list_files", {})).is_error
        abandoned = [r for r in JobStore().all() if r.repo == repo]
        open_job = next(r.job_id for r in abandoned if r.state == "running")
    async with Client(url, mode="2026-07-28") as client:  # no session: refused
        assert code(await client.call_tool("list_files", {})) == "USAGE_ERROR"
    return proposal, open_job


def test_http_sessions_each_get_a_job_ended_with_the_session(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    del sandbox_image
    repo = make_repo(tmp_path / "repo")
    err = (tmp_path / "server.err").open("w+")
    server = subprocess.Popen(
        [sys.executable, *server_args(tmp_path / "files", repo), "--http", "0"],
        stdout=subprocess.PIPE,
        stderr=err,
        cwd=ROOT,
        env=dict(os.environ),
    )
    try:
        url = ""

        def listening() -> bool:
            nonlocal url
            found = re.search(r"listening on (http://127\.0\.0\.1:\d+/mcp)", err_text())
            url = found.group(1) if found else ""
            return bool(url)

        def err_text() -> str:
            err.flush()
            return (tmp_path / "server.err").read_text()

        assert until(listening, 60.0), err_text()

        proposal, open_job = anyio.run(http_sessions, url, str(repo.resolve()))
        assert until(lambda: JobStore().load(open_job).state == "cancelled")
        assert until(lambda: not containers_of(docker_client, open_job))
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=60) == 143, err_text()
        assert server.stdout is not None
        assert server.stdout.read() == b""
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
        err.close()
    job_id = proposal["job_id"]
    assert proposal["status"] == "awaiting_review"
    assert '+    return "Hello " + name' in proposal["diff"]
    assert patchbox("apply", job_id).returncode == 0
    assert (repo / "app.py").read_text() == APP_AFTER
    assert patchbox("revert", job_id).returncode == 0
    assert (repo / "app.py").read_text() == APP


def test_stopping_an_http_server_closes_its_open_sessions(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    del sandbox_image
    repo = make_repo(tmp_path / "repo")
    err_path = tmp_path / "server.err"
    with err_path.open("w") as err:
        server = subprocess.Popen(
            [sys.executable, *server_args(tmp_path / "files", repo), "--http", "0"],
            stdout=subprocess.DEVNULL,
            stderr=err,
            cwd=ROOT,
            env=dict(os.environ),
        )
        try:

            def url() -> str:
                found = re.search(r"(http://127\.0\.0\.1:\d+/mcp)", err_path.read_text())
                return found.group(1) if found else ""

            assert until(lambda: bool(url()), 60.0), err_path.read_text()

            async def scenario() -> int:
                client = Client(url())
                await client.__aenter__()
                try:
                    assert not (await client.call_tool("list_files", {})).is_error
                    server.send_signal(signal.SIGINT)
                    return await anyio.to_thread.run_sync(server.wait, 60)
                finally:
                    with anyio.move_on_after(10), contextlib.suppress(Exception):
                        await client.__aexit__(None, None, None)

            assert anyio.run(scenario) == 130, err_path.read_text()
        finally:
            if server.poll() is None:
                server.kill()
                server.wait()
    record = the_job(repo)
    assert record.state == "cancelled"
    assert not containers_of(docker_client, record.job_id)
    assert "stopping (SIGINT)" in err_path.read_text()
