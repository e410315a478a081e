"""The command line: exit codes, JSON output, and the not-ready path."""

from __future__ import annotations

import json
from typing import Any

import pytest

from controller.logs import REDACTED, redact
from tests.support.entry import _patchbox


def test_bad_usage_exits_2() -> None:
    res = _patchbox("no-such-command", "--json")
    assert res.returncode == 2
    assert json.loads(res.stdout)["error"]["code"] == "USAGE_ERROR"


def test_unreachable_daemon_exits_3_with_an_instruction(tmp_path: Any) -> None:
    res = _patchbox("doctor", "--json", env={"DOCKER_HOST": f"unix://{tmp_path}/no.sock"})
    assert res.returncode == 3
    report = json.loads(res.stdout)
    assert report["ready"] is False
    assert "docker daemon unreachable" in report["problems"]
    assert any("start Docker" in a for a in report["advice"])
    res = _patchbox("image", "build", "--json", env={"DOCKER_HOST": f"unix://{tmp_path}/no.sock"})
    assert res.returncode == 3
    assert json.loads(res.stdout)["error"]["code"] == "ENVIRONMENT_NOT_READY"


def test_redaction_masks_secrets_and_private_paths(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-1234567890")
    monkeypatch.setenv("PATCHBOX_HOME", str(tmp_path))
    event = {
        "event": "x",
        "api_key": "anything",
        "detail": f"failed at {tmp_path}/jobs/1 with sk-test-1234567890",
        "count": 3,
    }
    out = redact(None, "info", event)
    assert out["api_key"] == REDACTED
    assert "sk-test" not in out["detail"]
    assert str(tmp_path) not in out["detail"]
    assert out["count"] == 3
