"""Best of N without a daemon: the attempts' requests (linked, held to review, under their
runner's lock, one provider each) and their ranking (required checks passed, then the
smaller diff, then the attempt's number)."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.api.attempts import Attempt, attempt_requests, ranked
from controller.config.task import TaskSpec
from controller.errors import UsageError
from controller.jobs.records import AttemptLink, CheckResult, FileChange, JobRecord, JobState
from controller.jobs.request import JobRequest
from controller.providers import ScriptedProvider, parse_calls


def _provider() -> ScriptedProvider:
    return ScriptedProvider(parse_calls('{"turns": []}'))


def _request(**extra: object) -> JobRequest:
    task = TaskSpec(prompt="p")
    return JobRequest(repo=Path("/r"), task=task, provider=_provider(), **extra)  # type: ignore[arg-type]


def test_the_requests_are_linked_held_to_review_and_under_the_runner_s_lock() -> None:
    providers = [_provider() for _ in range(3)]
    requests = attempt_requests(_request(), providers)
    ids = [r.job_id for r in requests]
    assert len(set(ids)) == 3
    assert all(i for i in ids)
    assert [r.provider for r in requests] == providers
    for index, r in enumerate(requests, start=1):
        assert r.attempt == AttemptLink(index=index, job_ids=ids)  # type: ignore[arg-type]
        assert r.repo_locked is True
        assert r.apply_denied == "one of 3 attempts: apply the one you choose"


def test_a_denial_the_request_had_is_kept() -> None:
    requests = attempt_requests(_request(apply_denied="tenant may not"), [_provider()] * 2)
    assert {r.apply_denied for r in requests} == {"tenant may not"}


@pytest.mark.parametrize("n", [0, 1, 17])
def test_the_number_of_attempts_is_bounded(n: int) -> None:
    with pytest.raises(UsageError, match=f"attempts must be from 2 to 16, not {n}"):
        attempt_requests(_request(), [_provider() for _ in range(n)])


def _attempt(index: int, state: JobState, checks: list[str], lines: int) -> Attempt:
    record = JobRecord(
        job_id=f"job-{index}",
        repo="/r",
        attempt=AttemptLink(index=index, job_ids=[]),
        checks=[
            CheckResult.model_validate(
                {
                    "id": f"c{k}",
                    "status": s,
                    "exit_code": 0,
                    "duration_ms": 1,
                    "output_tail": "",
                    "diff_sha256": "0" * 64,
                    "required": True,
                    "source": "docker-exec",
                }
            )
            for k, s in enumerate(checks)
        ],
        files=[
            FileChange(
                path="a.py",
                kind="modify",
                added=lines,
                removed=0,
                sha256_before=None,
                sha256_after=None,
            )
        ],
    )
    record.state = state
    return Attempt(record, "diff")


def test_passed_checks_first_then_the_smaller_diff_then_the_number() -> None:
    attempts = [
        _attempt(1, "failed", ["failed"], 1),
        _attempt(2, "awaiting_review", ["passed"], 9),
        _attempt(3, "awaiting_review", ["passed", "failed"], 1),
        _attempt(4, "awaiting_review", ["passed"], 2),
        _attempt(5, "no_change", [], 0),
        _attempt(6, "awaiting_review", ["passed"], 2),
    ]
    order = [a.record.job_id for a in ranked(attempts)]
    assert order == ["job-4", "job-6", "job-2", "job-3", "job-5", "job-1"]
