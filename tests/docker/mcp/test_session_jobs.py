"""One MCP session, several jobs: after ``propose`` (or the idle timeout) the next tool call
opens a new job on the repository's current state, and says so; the idle timeout releases
the sandbox and the repository's lock; the wall clock counts working time, not the client's
time between calls. Driven by the official SDK's own client over stdio, on real
repositories and the real daemon."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import docker
from mcp.client.client import Client

from controller.jobs.records import JobRecord
from controller.jobs.store import JobStore
from controller.mcp.slot import JOB_STARTED, PROPOSE
from tests.support.cli import job_files, patchbox
from tests.support.git import init
from tests.support.jobs import APP, APP_AFTER, FILES, containers_of
from tests.support.mcp import EDIT, LIMITS, ROOT, TASK, code, data, server_args, stdio, until

EDIT_CALL: dict[str, Any] = {"name": "replace_text", "arguments": EDIT}


def jobs_of(repo: Path) -> list[JobRecord]:
    """The jobs of ``repo``, oldest first (each test makes its own repository)."""
    found = [r for r in JobStore().all() if r.repo == str(repo.resolve())]
    return sorted(found, key=lambda r: r.created_at)


def idle_args(folder: Path, repo: Path, seconds: float, task: dict[str, Any] | None = None) -> Any:
    return stdio([*server_args(folder, repo, task), "--idle-timeout", f"{seconds:g}"])


def test_after_propose_the_next_call_opens_a_job_on_the_repositorys_current_state(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    del sandbox_image
    repo = init(tmp_path / "repo", FILES, message="greet")
    params = stdio(server_args(tmp_path / "files", repo.path))

    async def scenario() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        async with Client(params) as client:
            first = data(await client.call_tool("replace_text", EDIT))
            assert JOB_STARTED in first  # the first job says which it is too
            proposal = data(await client.call_tool(PROPOSE, {"message": "capitalized"}))
            assert proposal["status"] == "awaiting_review"
            assert "next tool call starts a new job" in proposal["next"]
            # the user applies the first job and commits it, with the server running
            applied = patchbox("apply", proposal["job_id"])
            assert applied.returncode == 0, applied.stderr
            repo.commit("capitalize")
            read = await client.call_tool("read_file", {"path": "app.py"})
            assert not read.is_error
            second = data(read)
            assert second["content"] == APP_AFTER  # the new job's baseline is the commit
            again = data(await client.call_tool("read_file", {"path": "app.py"}))
            assert JOB_STARTED not in again  # only a job's first answer carries it
            return first, proposal, second

    first, proposal, second = anyio.run(scenario)
    started = second[JOB_STARTED]
    first_id, second_id = proposal["job_id"], started["job_id"]
    assert first[JOB_STARTED]["job_id"] == first_id
    assert second_id != first_id
    assert started["message"].startswith(f"job {second_id} started on the repository's")
    assert f"the previous job {first_id} awaits review" in started["message"]
    records = jobs_of(repo.path)
    assert [(r.job_id, r.state) for r in records] == [
        (first_id, "applied"),
        (second_id, "cancelled"),  # the session ended with it open
    ]
    assert all(not containers_of(docker_client, r.job_id) for r in records)


def test_an_idle_job_with_a_change_is_proposed_and_releases_its_sandbox_and_the_lock(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    del sandbox_image
    repo = init(tmp_path / "repo", FILES, message="greet").path
    params = idle_args(tmp_path / "files", repo, 2)

    async def scenario() -> tuple[str, dict[str, Any], dict[str, Any]]:
        async with Client(params) as client:
            assert not (await client.call_tool("replace_text", EDIT)).is_error
            job_id = jobs_of(repo)[0].job_id
            assert containers_of(docker_client, job_id)
            ended = await anyio.to_thread.run_sync(
                lambda: until(lambda: JobStore().load(job_id).state == "awaiting_review", 60)
            )
            assert ended, JobStore().load(job_id).state
            assert until(lambda: not containers_of(docker_client, job_id))
            # the repository's lock is free: a CLI job on the same repository runs
            calls = {"turns": [[{"id": "c1", **EDIT_CALL}]], "final": "done"}
            files = job_files(tmp_path / "cli", TASK, calls)
            run = patchbox("run", "--repo", str(repo), *files, "--json")
            assert run.returncode == 0, run.stderr
            assert json.loads(run.stdout)["status"] == "awaiting_review"
            # propose after the idle end: the job as the idle timeout proposed it
            late = data(await client.call_tool(PROPOSE, {"message": "too late"}))
            assert late["job_id"] == job_id
            assert "no call for 2 s" in late["note"]
            assert code(await client.call_tool(PROPOSE, {})) == "USAGE_ERROR"
            nxt = data(await client.call_tool("read_file", {"path": "app.py"}))
            return job_id, late, nxt

    job_id, late, nxt = anyio.run(scenario)
    assert late["status"] == "awaiting_review"
    assert '+    return "Hello " + name' in late["diff"]
    assert nxt["content"] == APP  # nothing was applied: the next job starts from the commit
    message = nxt[JOB_STARTED]["message"]
    assert f"the previous job {job_id} was proposed as it was after 2 s without a call" in message
    assert "awaits review" in message
    record = JobStore().load(job_id)
    assert record.final_message is not None
    assert "idle timeout" in record.final_message
    records = jobs_of(repo)
    assert len(records) == 3  # the idle job, the CLI's, the session's next one
    assert records[2].job_id == nxt[JOB_STARTED]["job_id"]
    assert records[2].state == "cancelled"
    assert all(not containers_of(docker_client, r.job_id) for r in records)


def test_an_auto_job_the_idle_timeout_proposes_waits_for_review_and_is_never_applied(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    """Nobody asked for an idle job's proposal: it may be half done, so even an auto task
    whose checks pass stops for review, and the work tree is untouched."""
    del sandbox_image
    repo = init(tmp_path / "repo", FILES, message="greet").path
    args = server_args(tmp_path / "files", repo, {**TASK, "mode": "auto"}, "allow_auto = true\n")
    params = stdio([*args, "--idle-timeout", "2"])

    async def scenario() -> str:
        async with Client(params) as client:
            assert not (await client.call_tool("replace_text", EDIT)).is_error
            job_id = jobs_of(repo)[0].job_id
            ended = await anyio.to_thread.run_sync(
                lambda: until(
                    lambda: (
                        JobStore().load(job_id).state
                        in {"awaiting_review", "applied", "failed", "cancelled"}
                    ),
                    60,
                )
            )
            assert ended
            return job_id

    job_id = anyio.run(scenario)
    record = JobStore().load(job_id)
    assert record.state == "awaiting_review", record.error
    assert record.decision is not None
    assert not record.decision.applied
    assert "proposed by the idle timeout" in record.decision.reason
    assert [c.status for c in record.checks] == ["passed"]  # only the idle end held it back
    assert (repo / "app.py").read_text() == APP
    assert not containers_of(docker_client, job_id)


def test_an_idle_job_without_a_change_is_cancelled_and_the_next_call_works(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    del sandbox_image
    repo = init(tmp_path / "repo", FILES, message="greet").path
    params = idle_args(tmp_path / "files", repo, 2)

    async def scenario() -> tuple[str, dict[str, Any], dict[str, Any]]:
        async with Client(params) as client:
            assert not (await client.call_tool("list_files", {})).is_error
            job_id = jobs_of(repo)[0].job_id
            ended = await anyio.to_thread.run_sync(
                lambda: until(lambda: JobStore().load(job_id).state == "cancelled", 30)
            )
            assert ended
            assert until(lambda: not containers_of(docker_client, job_id))
            refused = await client.call_tool(PROPOSE, {})
            assert code(refused) == "USAGE_ERROR"
            nxt = data(await client.call_tool("replace_text", EDIT))
            return job_id, data(refused), nxt

    job_id, refused, nxt = anyio.run(scenario)
    assert (
        f"the job {job_id} changed nothing and was cancelled after 2 s"
        in (refused["error"]["message"])
    )
    assert f"the previous job {job_id} changed nothing" in nxt[JOB_STARTED]["message"]
    assert [r.state for r in jobs_of(repo)] == ["cancelled", "cancelled"]


def test_the_wall_clock_counts_working_time_not_the_clients_time_between_calls(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    del sandbox_image
    repo = init(tmp_path / "repo", FILES, message="greet").path
    task = {**TASK, "limits": {**LIMITS, "wall_seconds": 5}}
    params = idle_args(tmp_path / "files", repo, 60, task)

    async def scenario() -> dict[str, Any]:
        async with Client(params) as client:
            assert not (await client.call_tool("list_files", {})).is_error
            for _ in range(2):  # 12 s between calls, more than the wall clock of 5 s
                await anyio.sleep(6)
                assert not (await client.call_tool("read_file", {"path": "app.py"})).is_error
            assert not (await client.call_tool("replace_text", EDIT)).is_error
            return data(await client.call_tool(PROPOSE, {}))

    view = anyio.run(scenario)
    assert view["status"] == "awaiting_review", view
    records = jobs_of(repo)
    assert [r.state for r in records] == ["awaiting_review"]
    assert [c.ok for c in records[0].tool_calls] == [True, True, True, True]
    assert not containers_of(docker_client, view["job_id"])


def test_over_http_a_session_opens_its_next_job_after_propose(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    del sandbox_image
    repo = init(tmp_path / "repo", FILES, message="greet").path
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

            async def scenario() -> tuple[dict[str, Any], dict[str, Any]]:
                async with Client(url()) as client:
                    assert not (await client.call_tool("replace_text", EDIT)).is_error
                    proposal = data(await client.call_tool(PROPOSE, {}))
                    nxt = data(await client.call_tool("list_files", {}))
                    return proposal, nxt

            proposal, nxt = anyio.run(scenario)
            started = nxt[JOB_STARTED]
            assert f"the previous job {proposal['job_id']} awaits review" in started["message"]
            assert until(lambda: JobStore().load(started["job_id"]).state == "cancelled")
            server.send_signal(signal.SIGTERM)
            assert server.wait(timeout=60) == 143, err_path.read_text()
        finally:
            if server.poll() is None:
                server.kill()
                server.wait()
    records = jobs_of(repo)
    assert [(r.job_id, r.state) for r in records] == [
        (proposal["job_id"], "awaiting_review"),
        (started["job_id"], "cancelled"),  # with its HTTP session
    ]
    assert all(not containers_of(docker_client, r.job_id) for r in records)


NOTES_EDIT = {"path": "notes.txt", "oldText": "old notes", "newText": "new notes"}


def test_propose_with_follow_up_starts_the_next_job_on_its_result(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    """``propose`` with ``followUp``: the next call's job starts from the proposed job's
    result (the files as it left them, the repository untouched), its diff is the increment,
    and applying it applies the two."""
    del docker_client, sandbox_image
    repo = init(tmp_path / "repo", FILES, message="greet")
    params = stdio(server_args(tmp_path / "files", repo.path))

    async def scenario() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        async with Client(params) as client:
            await client.call_tool("replace_text", EDIT)
            first = data(await client.call_tool(PROPOSE, {"message": "one", "followUp": True}))
            assert first["status"] == "awaiting_review"
            read = data(await client.call_tool("read_file", {"path": "app.py"}))
            assert read["content"] == APP_AFTER  # the first job's result, not the repository
            await client.call_tool("replace_text", NOTES_EDIT)
            second = data(await client.call_tool(PROPOSE, {"message": "two"}))
            return first, read, second

    first, read, second = anyio.run(scenario)
    assert (
        f"started on the result of job {first['job_id']} (a follow-up)"
        in (read[JOB_STARTED]["message"])
    )
    assert second["status"] == "awaiting_review"
    assert [f["path"] for f in second["files"]] == ["notes.txt"]
    record = JobStore().load(second["job_id"])
    assert record.parent is not None
    assert (record.parent.job_id, record.parent.relation) == (first["job_id"], "follow-up")
    assert (repo.path / "app.py").read_text() == APP
    applied = patchbox("apply", second["job_id"])
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert (repo.path / "app.py").read_text() == APP_AFTER
    assert (repo.path / "notes.txt").read_text() == "new notes\n"
