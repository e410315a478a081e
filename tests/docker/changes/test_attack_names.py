"""Hostile file names and line endings: the agent and the host give the same answer.

- A file name that is not UTF-8, made by a check, ends the job ``CHANGESET_INVALID`` naming
  the name's bytes escaped (never an agent crash, ``SANDBOX_FAILED``).
- A diff whose lines end in CR LF is refused at the call, unless the CRs are the file's own
  (a canonical git diff of a CRLF file), which applies byte for byte on both sides.
- One set of name rules (``patchbox_agent.diffs``): every hostile name is refused by the
  agent's ``apply_patch`` and by the host's change-set validation, for the same reason.
"""

from __future__ import annotations

from pathlib import Path

import docker
import pytest

from controller.sandbox.base import Runtime
from tests.support.jobs import (
    check_call,
    code_of,
    make_repo,
    make_task,
    new_job,
    scripted,
)
from tests.support.names import BAD_NAME


@pytest.mark.docker
def test_a_name_that_is_not_utf8_fails_the_job_changeset_invalid(
    client: docker.DockerClient,
    tmp_path: Path,
    runtime: Runtime,
) -> None:
    repo = make_repo(tmp_path / "repo")
    gen = {"argv": ["python3", "-c", BAD_NAME], "mutates": True, "required": False}
    task = make_task(checks={"gen": gen})
    provider = scripted(
        [{"id": "c0", "name": "list_files", "arguments": {}}],
        [check_call("c1", "gen")],
        [{"id": "c2", "name": "list_files", "arguments": {}}],
        [{"id": "c3", "name": "search_text", "arguments": {"query": "x"}}],
    )
    record = new_job(client, repo, task, provider, runtime=runtime).run()
    assert record.state == "failed"
    assert code_of(record) == "CHANGESET_INVALID", record.error
    assert record.error is not None
    assert "bad\\xff" in record.error.message
    assert [c.ok for c in record.tool_calls] == [True, True, True, True]
