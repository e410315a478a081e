"""``patchbox mcp`` driven by the official SDK's client over stdio: run_check's ``args`` in
the tool's JSON Schema, an aimed run with the argv that ran, each refusal's exact reason,
a reused repeat, and the proposal's checks run with their defaults."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import docker
from mcp.client.client import Client

from controller.config.task import CheckSpec
from controller.jobs.store import JobStore
from controller.tools.schemas import tool_schemas
from tests.support.checkargs import (
    AIMED,
    AIMED_ARGV,
    AIMED_OUTPUT,
    OPTION,
    PROTECTED,
    REFUSALS,
    TASK,
    UNDECLARED,
    check_transcript,
)
from tests.support.jobs import EDIT, make_repo
from tests.support.mcp import code, data, server_args, stdio

CHECKS = {cid: CheckSpec.model_validate(spec) for cid, spec in TASK["checks"].items()}


def test_an_mcp_client_aims_a_check(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    del docker_client, sandbox_image
    repo = make_repo(tmp_path / "repo")
    params = stdio(server_args(tmp_path / "files", repo, TASK))

    async def scenario() -> dict[str, Any]:
        async with Client(params) as client:
            listed = {t.name: t for t in (await client.list_tools()).tools}
            (loop,) = (t for t in tool_schemas(CHECKS) if t["name"] == "run_check")
            assert listed["run_check"].input_schema == loop["parameters"]
            args = listed["run_check"].input_schema["properties"]["args"]
            assert (list(args["properties"]), args["additionalProperties"]) == (["file"], False)
            assert "argument file: a file or folder path" in (listed["run_check"].description or "")
            aimed = data(await client.call_tool("run_check", AIMED))
            assert (aimed["argv"], aimed["output"]) == (AIMED_ARGV, AIMED_OUTPUT)
            for arguments, message in zip(
                (OPTION, PROTECTED, UNDECLARED), REFUSALS.values(), strict=True
            ):
                refused = await client.call_tool("run_check", arguments)
                assert code(refused) == "TOOL_ARGUMENTS_INVALID"
                assert data(refused)["error"]["message"] == message
            again = data(await client.call_tool("run_check", AIMED))
            assert (again["argv"], again["reused"]) == (AIMED_ARGV, True)
            assert not (await client.call_tool("replace_text", EDIT["arguments"])).is_error
            proposal = await client.call_tool("propose", {"message": "capitalized"})
            assert not proposal.is_error
            return data(proposal)

    view = anyio.run(scenario)
    assert view["status"] == "awaiting_review"
    record = JobStore().load(view["job_id"])
    final = {c.id: c for c in record.checks}
    assert final["echo"].output_tail == "['app.py']\n"  # the final diff: the default
    transcript = record.model_dump(mode="json")["transcript"]
    ids = iter(["c1", "c2", "c3", "c4", "c5"])
    for turn in transcript:  # the session's calls under the ids of tests.support.checkargs
        for call in turn.get("calls", []):
            if call["name"] == "run_check":
                call["id"] = next(ids)
    check_transcript(transcript)
