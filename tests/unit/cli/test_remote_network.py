"""``patchbox remote show``'s network section: each request of an egress check as the
service's job view gives it; a view without ``network`` has none; what a hostile service
sends in place of a list or an object is skipped, not a crash."""

from __future__ import annotations

from typing import cast

from controller.cli.remote_text import job_outcome, network_lines, summary
from controller.remoteviews import RemoteJob

ALLOWED = {
    "host": "files.example.com",
    "port": 443,
    "address": "203.0.113.7",
    "allowed": True,
    "status": 200,
    "bytes_out": 310,
    "bytes_in": 5120,
    "start": 1.0,
    "end": 1.5,
}
REFUSED = {
    "host": "other.example.com",
    "port": 443,
    "allowed": False,
    "reason": "not_allowed",
    "status": 403,
    "bytes_out": 120,
    "bytes_in": 3300,
    "start": 2.0,
    "end": 2.1,
}


def _view(checks: object) -> RemoteJob:
    return cast("RemoteJob", {"job_id": "j1", "status": "failed", "files": [], "checks": checks})


def _check(check_id: str, **more: object) -> dict[str, object]:
    return {"id": check_id, "status": "passed", "exit_code": 0, "duration_ms": 1, **more}


def test_each_request_of_a_check_is_shown() -> None:
    checks = [
        _check("tests", network=[ALLOWED, REFUSED]),
        _check("quiet", network=[]),
        _check("offline"),
    ]
    lines = summary(_view(checks)).splitlines()
    start = lines.index("network (through the job's proxy):")
    first = "  check tests: files.example.com:443 [203.0.113.7] allowed, status 200, "
    second = "  check tests: other.example.com:443 refused (not_allowed), status 403, "
    assert lines[start + 1 :] == [
        first + "310 B out, 5120 B in",
        second + "120 B out, 3300 B in",
        "  check quiet: no request",
    ]


def test_no_network_no_section_and_hostile_shapes_are_skipped() -> None:
    assert "network" not in summary(_view([_check("t")]))
    hostile: list[object] = [
        [_check("t", network="nope")],
        [_check("t", network=[1, None, "x"])],
        ["not a check", 7],
        "not a list",
        None,
    ]
    for checks in hostile:
        assert network_lines(checks) == []


def test_a_waited_job_that_made_no_change_exits_as_run_does() -> None:
    """``remote submit --wait``: 5 for ``no_change``, 0 with ``--no-change-ok``; the flag
    changes nothing else."""
    from controller.cli.parser import build_parser

    none = cast("RemoteJob", {"status": "no_change", "error": {"code": "NO_CHANGE"}})
    failed = cast("RemoteJob", {"status": "failed", "error": {"code": "CHECK_FAILED"}})
    assert job_outcome(none) == 5
    assert job_outcome(none, no_change_ok=True) == 0
    assert job_outcome(failed, no_change_ok=True) == job_outcome(failed) != 0
    args = build_parser().parse_args(
        ["remote", "submit", "--repo", ".", "--task", "t.json", "--wait", "--no-change-ok"]
    )
    assert args.no_change_ok is True


def test_remote_show_prints_the_checks_before_the_change_and_the_table() -> None:
    """As ``show`` does: each check's run before the change and the before/after table of
    the required checks; shapes a hostile service might send are skipped."""
    view = cast(
        "RemoteJob",
        {
            "job_id": "j1",
            "status": "awaiting_review",
            "baseline_checks": [
                {"id": "tests", "status": "failed", "exit_code": 1, "duration_ms": 40},
                "not an object",
            ],
            "checks": [{"id": "tests", "status": "passed", "exit_code": 0, "duration_ms": 30}],
            "decision": {
                "reason": "review mode",
                "check_changes": [
                    {"id": "tests", "before": "failed", "after": "passed", "change": "fixed"},
                    7,
                ],
            },
        },
    )
    text = summary(view).splitlines()
    assert "  check tests before the change: failed (exit 1, 40 ms)" in text
    assert text[text.index("checks before -> after the change:") + 1] == (
        "  tests: fixed (failed -> passed)"
    )
    assert text[-1] == "review: patchbox remote show j1 --diff; then patchbox remote apply j1"
