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

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp.client.client import Client

from controller import api
from controller.api.session import SESSION_PROMPT
from controller.config.host import HostConfig
from controller.config.task import TaskSpec
from controller.jobs.store import JobStore
from controller.mcp.server import PROMPT_URI, SESSIONLESS, build_server, tools
from controller.mcp.slot import CHECKS_URI, PROPOSE, Options, Sessions, Slot
from controller.tools.schemas import tool_schemas
from tests.support.cli import patchbox
from tests.support.jobs import GREET, make_repo
from tests.support.mcp import LOOP_TOOLS, TASK, code, data

# -- the server in-process: no daemon needed ----------------------------------------------


def options(tmp_path: Path, **fields: Any) -> Options:
    repo = make_repo(tmp_path / "repo")
    return Options(
        repo=repo,
        task=TaskSpec.model_validate(TASK),
        config=HostConfig(spare_sandboxes=0, **fields),
        task_given=True,
    )


def test_the_tools_are_the_loops_and_propose_and_never_an_apply_tool(tmp_path: Path) -> None:
    listed = tools()
    assert [t.name for t in listed] == [*LOOP_TOOLS, PROPOSE]
    for tool, loop in zip(listed, tool_schemas(), strict=False):
        assert (tool.description, tool.input_schema) == (loop["description"], loop["parameters"])
    propose = listed[-1].input_schema
    assert propose["properties"]["message"]["type"] == "string"
    assert (propose["additionalProperties"], propose.get("required")) == (False, None)
    opts = options(tmp_path, allow_auto=True)
    server = build_server(opts, Sessions(lambda: Slot(opts, print)))

    async def listing() -> list[str]:
        async with Client(server) as client:
            return [t.name for t in (await client.list_tools()).tools]

    assert "apply" not in anyio.run(listing)


def test_resources_and_a_propose_before_any_call_need_no_sandbox(tmp_path: Path) -> None:
    opts = options(tmp_path)
    made: list[Slot] = []

    def slot() -> Slot:
        made.append(Slot(opts, lambda _m: None))
        return made[-1]

    server = build_server(opts, Sessions(slot))

    async def scenario() -> None:
        async with Client(server) as client:
            uris = [r.uri for r in (await client.list_resources()).resources]
            assert uris == [PROMPT_URI, CHECKS_URI]
            prompt = await client.read_resource(PROMPT_URI)
            assert prompt.contents[0].text == TASK["prompt"]  # type: ignore[union-attr]
            checks = json.loads((await client.read_resource(CHECKS_URI)).contents[0].text)  # type: ignore[union-attr]
            assert checks["checks"]["greet"]["argv"] == GREET["argv"]
            early = await client.call_tool(PROPOSE, {})
            assert code(early) == "USAGE_ERROR"
            assert "nothing to propose" in data(early)["error"]["message"]
            bad = await client.call_tool(PROPOSE, {"message": 5})
            assert code(bad) == "TOOL_ARGUMENTS_INVALID"

    anyio.run(scenario)
    assert [s.opened for s in made] == [False]
    assert [r for r in JobStore().all() if r.repo == str(opts.repo.resolve())] == []


def test_an_unexpected_error_in_a_call_is_internal_error_with_a_crash_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom(*_args: object) -> None:
        msg = "boom"
        raise RuntimeError(msg)

    monkeypatch.setattr(Slot, "call", boom)
    opts = options(tmp_path)
    server = build_server(opts, Sessions(lambda: Slot(opts, lambda _m: None)))

    async def scenario() -> Any:
        async with Client(server) as client:
            return await client.call_tool("read_file", {"path": "app.py"})

    result = anyio.run(scenario)
    assert code(result) == "INTERNAL_ERROR"
    assert "crash report is crash/" in data(result)["error"]["message"]
    assert set(data(result)) == {"error"}


def test_without_a_task_the_session_has_the_default_prompt_and_the_configured_checks(
    tmp_path: Path,
) -> None:
    repo = make_repo(tmp_path / "repo")
    (repo / ".patchbox").mkdir()
    suggested = {"lint": {"argv": ["true"]}}
    (repo / ".patchbox" / "checks.json").write_text(json.dumps(suggested))
    config = HostConfig.model_validate({"spare_sandboxes": 0, "checks": {"greet": GREET}})
    opts = Options(repo=repo, task=api.default_task(config), config=config)
    trusting = Options(repo=repo, task=opts.task, config=config, trust_repo_config=True)

    async def read(options: Options) -> tuple[str, dict[str, Any], str]:
        server = build_server(options, Sessions(lambda: Slot(options, print)))
        async with Client(server) as client:
            prompt = (await client.read_resource(PROMPT_URI)).contents[0]
            checks = (await client.read_resource(CHECKS_URI)).contents[0]
            return prompt.text, json.loads(checks.text)["checks"], client.instructions or ""  # type: ignore[union-attr]

    prompt, checks, instructions = anyio.run(read, opts)
    assert (prompt, list(checks)) == (SESSION_PROMPT, ["greet"])
    assert SESSION_PROMPT not in instructions
    assert "propose" in instructions
    _, checks, _ = anyio.run(read, trusting)
    assert sorted(checks) == ["greet", "lint"]


def test_an_http_request_without_a_session_is_refused(tmp_path: Path) -> None:
    opts = options(tmp_path)
    server = build_server(opts, Sessions(lambda: Slot(opts, print)), http=True)

    async def scenario() -> None:
        async with Client(server, mode="2026-07-28") as client:  # in-process, sessionless
            refused = await client.call_tool("list_files", {})
            assert code(refused) == "USAGE_ERROR"
            assert data(refused)["error"]["message"] == SESSIONLESS

    anyio.run(scenario)


def test_bad_command_lines_fail_before_serving(tmp_path: Path) -> None:
    (tmp_path / "plain").mkdir()
    res = patchbox("mcp", "--repo", str(tmp_path / "plain"))
    assert (res.returncode, res.stdout) == (2, "")
    assert "patchbox: error NOT_A_REPOSITORY" in res.stderr
    repo = make_repo(tmp_path / "repo")
    res = patchbox("mcp", "--repo", str(repo), "--http", "70000")
    assert (res.returncode, res.stdout) == (2, "")
    assert "USAGE_ERROR" in res.stderr


def test_a_bad_idle_timeout_fails_before_serving(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    for bad in ("0", "-1", "nan", "100000"):
        res = patchbox("mcp", "--repo", str(repo), "--idle-timeout", bad)
        assert (res.returncode, res.stdout) == (2, ""), bad
        assert "--idle-timeout" in res.stderr


def test_the_listed_run_check_names_the_sessions_checks(tmp_path: Path) -> None:
    """What an MCP client's model reads: checkId an enum of the session's check ids, each
    check described in run_check's description and the instructions; none said plainly."""
    with_checks = options(tmp_path / "a")
    without = Options(
        repo=with_checks.repo,
        task=TaskSpec.model_validate(TASK | {"checks": {}}),
        config=with_checks.config,
        task_given=True,
    )

    async def listing(opts: Options) -> tuple[dict[str, Any], str, str]:
        server = build_server(opts, Sessions(lambda: Slot(opts, print)))
        async with Client(server) as client:
            listed = {t.name: t for t in (await client.list_tools()).tools}
            run_check = listed["run_check"]
            return run_check.input_schema, run_check.description or "", client.instructions or ""

    schema, description, instructions = anyio.run(listing, with_checks)
    assert schema["properties"]["checkId"]["enum"] == ["greet"]
    line = "- greet: python3 check.py (the change must pass it; at most 60 s)"
    assert description.endswith(line)
    assert line in instructions
    schema, description, instructions = anyio.run(listing, without)
    assert "enum" not in schema["properties"]["checkId"]
    none = "This job has no configured checks, so run_check has nothing to run: do not call it."
    assert description.endswith(none)
    assert none in instructions


def test_the_tool_list_follows_the_checks_as_they_resolve_now(tmp_path: Path) -> None:
    """With ``--trust-repo-config``, a check the repository suggests after the server
    started is in the next tool list's ``checkId`` enum (and one it drops is gone)."""
    repo = make_repo(tmp_path / "repo")
    config = HostConfig.model_validate({"spare_sandboxes": 0, "checks": {"greet": GREET}})
    opts = Options(repo=repo, task=api.default_task(config), config=config, trust_repo_config=True)
    suggested = repo / ".patchbox" / "checks.json"

    async def scenario() -> list[list[str]]:
        server = build_server(opts, Sessions(lambda: Slot(opts, print)))
        seen = []
        async with Client(server) as client:
            for checks in (None, {"lint": {"argv": ["true"]}}, {}):
                if checks is not None:
                    suggested.parent.mkdir(exist_ok=True)
                    suggested.write_text(json.dumps(checks))
                listed = {t.name: t for t in (await client.list_tools()).tools}
                seen.append(listed["run_check"].input_schema["properties"]["checkId"]["enum"])
        return seen

    assert anyio.run(scenario) == [["greet"], ["greet", "lint"], ["greet"]]
