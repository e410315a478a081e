"""The command line: exit codes, JSON output, and the not-ready path."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from controller import api
from controller.cli.doctor import diagnose
from controller.config.host import load_config
from controller.config.task import TaskSpec
from controller.errors import ExitCode, UsageError
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


NO_PROVIDER_ENV = {
    "OPENAI_API_KEY": "",
    "OPENAI_BASE_URL": "",
    "PATCHBOX_MODEL": "",
    "PATCHBOX_PROVIDER_API": "",
    "PATCHBOX_PROVIDER_STREAM": "",
}
"""Empty counts as unset: no provider setting from the test run's environment."""


def test_doctor_says_first_that_run_refuses_the_provider_and_exits_1(tmp_path: Path) -> None:
    """A key over plain http to a host that is not loopback: ``run`` refuses it, so doctor
    is not ready, says so first, names the refusal (never the key) and exits 1, before
    and whatever the daemon says."""
    key = "sk-doctor-PLANTED-7d1e"
    config = tmp_path / "config.toml"
    config.write_text(
        '[provider]\nmodel = "m1"\nbase_url = "http://10.20.30.40:8080/v1"\n'
        'api_key_env = "DOCTOR_KEY"\n'
    )
    env = NO_PROVIDER_ENV | {"DOCTOR_KEY": key, "DOCKER_HOST": f"unix://{tmp_path}/no.sock"}
    res = _patchbox("doctor", "--config", str(config), "--json", env=env)
    assert res.returncode == 1, res.stderr
    report = json.loads(res.stdout)
    assert report["ready"] is False
    assert report["problems"][0].startswith("provider refused: ")
    assert "only over https" in report["problems"][0]
    assert "docker daemon unreachable" in report["problems"][1:]
    provider = report["provider"]
    assert provider["configured"] is False
    assert provider["refused"] in report["problems"][0]
    assert (provider["model"], provider["base_url"]) == ("m1", "http://10.20.30.40:8080/v1")
    text = _patchbox("doctor", "--config", str(config), env=env)
    assert text.returncode == 1
    lines = text.stdout.splitlines()
    assert lines[0] == "ready: no"
    assert lines[1].startswith("problem: provider refused: ")
    assert "provider: m1 at http://10.20.30.40:8080/v1: refused" in text.stdout
    assert key not in res.stdout + res.stderr + text.stdout + text.stderr


def test_doctor_agrees_with_run_on_the_provider(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same settings, the same verdict: what ``run`` refuses (its provider choice)
    doctor refuses with the same message, what it takes doctor takes (model and endpoint as
    ``run`` reads them), and no settings at all is no provider, not a refusal."""
    for name, value in (NO_PROVIDER_ENV | {"DOCKER_HOST": f"unix://{tmp_path}/x"}).items():
        monkeypatch.setenv(name, value)
    task = TaskSpec(prompt="p")
    cases = {
        "refused": ('[provider]\nmodel = "m"\nbase_url = "ftp://h/v1"\n', "refused"),
        "no model": ('[provider]\nbase_url = "https://h.example/v1"\n', "refused"),
        "bad key": ('[provider]\nmodel = "m"\napi_key = "a b"\n', "refused"),
        "taken": ('[provider]\nmodel = "m"\nbase_url = "https://h.example/v1/"\n', "taken"),
        "none": ("", "none"),
    }
    for name, (text, verdict) in cases.items():
        config = tmp_path / f"{name}.toml"
        config.write_text(text)
        report = diagnose(probe_runsc=False, config_path=config)
        provider = report.provider
        try:
            choice = api.choose_provider(load_config(config), task)
        except UsageError as exc:
            refusal: str | None = exc.message
        else:
            refusal = None
            choice.provider.close()
        if verdict == "refused":
            assert refusal is not None, name
            assert provider.refused == refusal, name
            assert report.problems[0] == f"provider refused: {refusal}", name
            assert report.exit_code == ExitCode.FAILED
        elif verdict == "taken":
            assert refusal is None, name
            assert (provider.configured, provider.refused) == (True, None)
            assert (provider.model, provider.base_url) == ("m", "https://h.example/v1")
            assert report.exit_code == ExitCode.NOT_READY  # only the daemon is missing
        else:
            assert refusal is not None
            assert "no model configured" in refusal
            assert (provider.configured, provider.refused, provider.model) == (False, None, None)
            assert report.problems == ["docker daemon unreachable"]
        assert report.problems[-1] == "docker daemon unreachable", name


def test_doctor_refuses_a_configuration_run_refuses_first_with_exit_1(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("spare_sandboxes = 99\n")
    env = NO_PROVIDER_ENV | {"DOCKER_HOST": f"unix://{tmp_path}/no.sock"}
    res = _patchbox("doctor", "--config", str(bad), "--json", env=env)
    assert res.returncode == 1
    report = json.loads(res.stdout)
    assert report["ready"] is False
    assert report["problems"][0] == report["config_error"]
    assert "spare_sandboxes" in report["config_error"]
    lines = _patchbox("doctor", "--config", str(bad), env=env).stdout.splitlines()
    assert lines[:2] == ["ready: no", f"problem: {report['config_error']}"]


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
