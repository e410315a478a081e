"""Required checks: a fresh sandbox from the baseline plus the validated diff, and
each check run as its own process whose exit status comes from the Docker API.

The agent in the fresh container only unpacks the baseline and applies the diff; what it
says about a check is never used. Each check is ``docker exec``'d (as the sandbox user, in
/workspace, with the check's minimal environment) under ``timeout -s KILL``; its result is
the ``ExitCode`` Docker reports for that exec, bound to the diff's SHA-256.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Literal

import docker
import docker.errors

from controller.config.task import CheckSpec
from controller.errorinfo import ErrorInfo
from controller.errors import ErrorCode, PatchboxError, SandboxError, ToolError
from controller.jobs.junit import MAX_JUNIT_BYTES, JunitError, parse_cases
from controller.jobs.periodic import periodically
from controller.jobs.records import CheckResult, Decision, requests_of
from controller.repo.baseline import Baseline
from controller.sandbox.base import SandboxSpec
from controller.sandbox.cache import BaselineCache
from controller.sandbox.docker import SANDBOX_UID, DockerSandbox
from controller.sandbox.labels import ControllerIdentity
from controller.sandbox.netgate import NetworkGate, checked, refused_text
from controller.sandbox.prepare import start_with_baseline
from controller.text import strip_control

OUTPUT_TAIL = 8192
TIMEOUT_EXIT = 137
"""``timeout -s KILL`` ends an overrunning check with SIGKILL: exit 128 + 9."""


def _exec(
    client: docker.DockerClient,
    container_id: str,
    spec: CheckSpec,
    stop: threading.Event,
    run_env: dict[str, str],
) -> tuple[int | None, str, bool, int]:
    argv = ["timeout", "-s", "KILL", f"{spec.timeout_seconds:g}", *spec.argv_with()]
    started = time.monotonic()
    exec_id = client.api.exec_create(
        container_id,
        argv,
        stdout=True,
        stderr=True,
        stdin=False,
        tty=False,
        user=f"{SANDBOX_UID}:{SANDBOX_UID}",
        workdir="/workspace",
        environment={**spec.environment(), **run_env},
    )["Id"]
    tail = b""
    for chunk in client.api.exec_start(exec_id, stream=True, demux=False):
        tail = (tail + chunk)[-max(spec.output_limit, OUTPUT_TAIL) :]
        if stop.is_set():
            break
    info = client.api.exec_inspect(exec_id)
    while info.get("Running") and not stop.is_set():
        time.sleep(0.05)
        info = client.api.exec_inspect(exec_id)
    elapsed = time.monotonic() - started
    code = info.get("ExitCode")
    timed_out = code == TIMEOUT_EXIT and elapsed >= spec.timeout_seconds
    text = strip_control(tail.decode("utf-8", "replace"))[-OUTPUT_TAIL:]
    return code, text, timed_out, round(elapsed * 1000)


def run_required_checks(  # noqa: PLR0913 - the inputs of one check stage, all keyword-only
    client: docker.DockerClient,
    *,
    baseline: Baseline,
    diff: str,
    diff_sha256: str,
    checks: Mapping[str, CheckSpec],
    spec: SandboxSpec,
    identity: ControllerIdentity,
    cache: BaselineCache | None = None,
    stop: threading.Event | None = None,
    on_check: Callable[[str], None] | None = None,
    gate: NetworkGate | None = None,
) -> list[CheckResult]:
    """Runs every check in ``checks`` (required or not) in one fresh sandbox holding the
    baseline plus ``diff``; the container is removed afterwards, whatever happened. With a
    ``gate`` (``spec`` on the job's egress network) each check reaches its own ``egress``
    while it runs, and its requests are in its result."""
    stop = stop or threading.Event()
    if gate is not None:
        gate.renew()  # the fresh sandbox's services are fresh too
    box = start_with_baseline(client, baseline, spec, identity, cache or BaselineCache())
    try:
        with _closed_on_stop(box, stop):
            if diff:
                try:
                    box.apply_patch(diff)
                except ToolError as exc:
                    msg = f"the validated diff does not apply in the check sandbox: {exc.message}"
                    raise PatchboxError(msg, code=ErrorCode.CHECK_FAILED) from exc
            results = []
            for item in checks.items():
                if on_check is not None:
                    on_check(item[0])
                with checked(gate, item[0]) as seen:
                    result = _run_one(client, box, item, diff_sha256, stop)
                if gate is not None and gate.records():
                    result = result.model_copy(update={"network": requests_of(seen)})
                results.append(result)
            return results
    except SandboxError:
        _raise_if_stopped(stop)
        raise
    finally:
        box.close()


def _run_one(
    client: docker.DockerClient,
    box: DockerSandbox,
    check: tuple[str, CheckSpec],
    diff_sha256: str,
    stop: threading.Event,
) -> CheckResult:
    check_id, spec = check
    container_id = box.container.id or ""
    _raise_if_stopped(stop)
    try:
        code, text, timed_out, ms = _exec(client, container_id, spec, stop, box.run_env)
    except (docker.errors.DockerException, OSError) as exc:  # requests' errors are OSErrors
        _raise_if_stopped(stop)
        msg = f"check {check_id} could not be run: {type(exc).__name__}"
        raise SandboxError(msg) from exc
    _raise_if_stopped(stop)
    status: Literal["passed", "failed", "timed_out"] = "failed"
    if timed_out:
        status = "timed_out"
    elif code == 0:
        status = "passed"
    tests, junit_error = None, None
    if spec.junit is not None:
        try:
            tests = parse_cases(_read_junit(client, container_id, spec.junit))
        except JunitError as exc:
            junit_error = f"{spec.junit}: {exc}"
    return CheckResult(
        id=check_id,
        status=status,
        exit_code=code,
        duration_ms=ms,
        output_tail=text,
        diff_sha256=diff_sha256,
        required=spec.required,
        source="docker-exec",
        tests=tests,
        junit_error=junit_error,
    )


def _read_junit(client: docker.DockerClient, container_id: str, path: str) -> bytes:
    """The check's JUnit file, read in the sandbox as the sandbox user (a link in it reaches
    only what that user may read there), at most one byte over the bound."""
    try:
        exec_id = client.api.exec_create(
            container_id,
            ["head", "-c", str(MAX_JUNIT_BYTES + 1), "--", path],
            stdout=True,
            stderr=False,
            user=f"{SANDBOX_UID}:{SANDBOX_UID}",
            workdir="/workspace",
            environment={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
        )["Id"]
        data = client.api.exec_start(exec_id, stream=False, demux=False)
        code = client.api.exec_inspect(exec_id).get("ExitCode")
    except (docker.errors.DockerException, OSError) as exc:
        msg = f"it could not be read ({type(exc).__name__})"
        raise JunitError(msg) from exc
    if code != 0:
        msg = "the check did not write it (or it cannot be read)"
        raise JunitError(msg)
    return bytes(data or b"")


def _closed_on_stop(
    box: DockerSandbox, stop: threading.Event
) -> contextlib.AbstractContextManager[None]:
    """A check blocks on its output stream; killing the container on cancel ends it (the
    caller's ``finally`` removes it)."""

    def watch() -> bool:
        if stop.is_set():
            box.interrupt()
            return True
        return False

    return periodically(0.1, watch, "check-cancel")


def _raise_if_stopped(stop: threading.Event) -> None:
    if stop.is_set():
        raise PatchboxError("cancelled during the checks", code=ErrorCode.CANCELLED)


def skipped_checks(checks: Mapping[str, CheckSpec], diff_sha256: str) -> list[CheckResult]:
    """The checks as the trusted-auto mode records them: skipped, none run."""
    return [
        CheckResult(
            id=cid,
            status="skipped",
            exit_code=None,
            duration_ms=0,
            output_tail="",
            diff_sha256=diff_sha256,
            required=c.required,
            reason="trusted-auto: project checks skipped",
            source="none",
        )
        for cid, c in checks.items()
    ]


def check_failed(decision: Decision, checks: Sequence[CheckResult]) -> ErrorInfo:
    """``CHECK_FAILED`` naming the required checks that did not pass (and those failing
    before the change too, and what the proxy refused them)."""
    failed, still = decision.failed_checks or [], decision.still_failing or []
    return ErrorInfo(
        code=str(ErrorCode.CHECK_FAILED),
        message="required check(s) did not pass: "
        + ", ".join(failed)
        + (f" (failing before the change too: {', '.join(still)})" if still else "")
        + refused_by_proxy(checks, failed),
    )


def refused_by_proxy(checks: Sequence[CheckResult], failed: Sequence[str]) -> str:
    """For a failure message: the pairs the job's proxy refused to the checks that failed
    (empty when it refused none), so the user knows what to add to a check's ``egress``."""
    parts = []
    for result in checks:
        if result.id in failed and result.network:
            text = refused_text(result.network)
            if text:
                parts.append(f"{result.id} tried {text}")
    return "; the proxy refused: " + "; ".join(parts) if parts else ""
