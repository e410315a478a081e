"""The decision about a job's diff (:func:`controller.jobs.decision.decide`): pure, so a table
of cases, no Docker."""

from __future__ import annotations

from typing import Any

import pytest

from controller.jobs.decision import GATE_HINTS, DecisionInputs, decide, skips_checks, with_conflict
from controller.jobs.records import CheckResult, Decision, FileChange

ALL_GATES = {
    "operator_enabled": True,
    "apply_permitted": True,
    "checks_passed": True,
    "no_deleted_file": True,
    "no_dependency_or_config_path": True,
    "no_control_characters": True,
    "baseline_unchanged": True,
}
REVIEW = "review: a person applies or discards"
DENIED = "tenant 'beta' may not apply jobs (allow_apply = false)"
SKIPPED = "skipped (trusted-auto): no claim that checks passed"


def check(cid: str, status: str, *, required: bool = True) -> CheckResult:
    return CheckResult.model_validate(
        {
            "id": cid,
            "status": status,
            "exit_code": None if status == "skipped" else int(status != "passed"),
            "duration_ms": 1,
            "output_tail": "",
            "diff_sha256": "0" * 64,
            "required": required,
            "source": "none" if status == "skipped" else "docker-exec",
        }
    )


def changed(path: str, kind: str = "modify", old_path: str | None = None) -> FileChange:
    return FileChange(path=path, old_path=old_path, kind=kind, added=1, removed=1)


def inputs(**overrides: Any) -> DecisionInputs:
    """Everything allowed and every fact good; each case changes what it is about."""
    fields: dict[str, Any] = {
        "mode": "auto",
        "allow_auto": True,
        "allow_trusted_auto": True,
        "consent_trusted_auto": True,
        "checks": [check("tests", "passed")],
        "files": [changed("src/app.py")],
        "baseline_unchanged": True,
    }
    return DecisionInputs.model_validate(fields | overrides)


def fell_back(*failing: str, failed_checks: list[str] | None = None) -> dict[str, Any]:
    """Auto's decision when the gates named fail."""
    expected: dict[str, Any] = {
        "mode": "auto",
        "applied": False,
        "gates": ALL_GATES | dict.fromkeys(failing, False),
        "reason": "auto fell back to review: "
        + ", ".join(f"{name} ({GATE_HINTS[name]})" for name in failing),
    }
    return expected | ({"failed_checks": failed_checks} if failed_checks else {})


CASES: list[tuple[str, DecisionInputs, dict[str, Any]]] = [
    (
        "review",
        inputs(mode="review"),
        {"mode": "review", "applied": False, "gates": {}, "reason": REVIEW},
    ),
    (
        "review_failed_check",
        inputs(mode="review", checks=[check("a", "passed"), check("b", "timed_out")]),
        {
            "mode": "review",
            "applied": False,
            "gates": {},
            "reason": REVIEW,
            "failed_checks": ["b"],
        },
    ),
    (
        "review_optional_check_failed",
        inputs(mode="review", checks=[check("lint", "failed", required=False)]),
        {"mode": "review", "applied": False, "gates": {}, "reason": REVIEW},
    ),
    (
        "auto_every_gate",
        inputs(),
        {"mode": "auto", "applied": True, "gates": ALL_GATES, "reason": "auto: every gate holds"},
    ),
    (
        "auto_not_enabled",
        inputs(allow_auto=False),
        fell_back("operator_enabled"),
    ),
    (
        "auto_apply_denied",
        inputs(apply_denied=DENIED),
        {
            "mode": "auto",
            "applied": False,
            "gates": ALL_GATES | {"apply_permitted": False},
            "reason": f"auto fell back to review: apply_permitted ({DENIED})",
        },
    ),
    (
        "auto_apply_denied_and_not_enabled",
        inputs(apply_denied=DENIED, allow_auto=False),
        {
            "mode": "auto",
            "applied": False,
            "gates": ALL_GATES | {"operator_enabled": False, "apply_permitted": False},
            "reason": "auto fell back to review: operator_enabled (allow_auto = false in the "
            f"host configuration), apply_permitted ({DENIED})",
        },
    ),
    (
        "auto_no_checks",
        inputs(checks=[]),
        fell_back("checks_passed"),
    ),
    (
        "auto_check_failed",
        inputs(checks=[check("tests", "failed")], baseline_unchanged=False),
        fell_back("checks_passed", "baseline_unchanged", failed_checks=["tests"]),
    ),
    (
        "auto_deleted_file",
        inputs(files=[changed("old.py", "delete")]),
        fell_back("no_deleted_file"),
    ),
    (
        "auto_lock_file",
        inputs(files=[changed("web/Package-Lock.json")]),
        fell_back("no_dependency_or_config_path"),
    ),
    *[
        (
            f"auto_{name}",
            inputs(files=[changed(f"sub/{name}")]),
            fell_back("no_dependency_or_config_path"),
        )
        for name in ("requirements.txt", "go.sum", "Cargo.lock", "pyproject.toml", "package.json")
    ],
    (
        "auto_renamed_from_config",
        inputs(files=[changed("notes.txt", "rename", old_path="setup.cfg")]),
        fell_back("no_dependency_or_config_path"),
    ),
    (
        "auto_control_characters",
        inputs(control_lines=2),
        fell_back("no_control_characters"),
    ),
    (
        "auto_ci_config",
        inputs(files=[changed(".github/workflows/ci.yml")]),
        fell_back("no_dependency_or_config_path"),
    ),
    (
        "trusted_auto",
        inputs(mode="trusted-auto", checks=[check("tests", "skipped")]),
        {
            "mode": "trusted-auto",
            "applied": True,
            "gates": {},
            "checks": SKIPPED,
            "reason": "trusted-auto with operator enablement and consent",
        },
    ),
    (
        "trusted_auto_apply_denied",
        inputs(mode="trusted-auto", apply_denied=DENIED, checks=[check("t", "failed")]),
        {
            "mode": "trusted-auto",
            "applied": False,
            "gates": {},
            "reason": f"trusted-auto fell back to review: {DENIED}",
            "failed_checks": ["t"],
        },
    ),
    (
        "trusted_auto_not_enabled",
        inputs(mode="trusted-auto", allow_trusted_auto=False),
        {
            "mode": "trusted-auto",
            "applied": False,
            "gates": {},
            "reason": "trusted-auto fell back to review: not enabled by the operator "
            "(allow_trusted_auto = false in the host configuration)",
        },
    ),
    (
        "trusted_auto_no_consent",
        inputs(mode="trusted-auto", consent_trusted_auto=False, checks=[check("t", "failed")]),
        {
            "mode": "trusted-auto",
            "applied": False,
            "gates": {},
            "reason": "trusted-auto fell back to review: no consent to it (consent_trusted_auto is not set)",
            "failed_checks": ["t"],
        },
    ),
]


@pytest.mark.parametrize(("given", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_decide(given: DecisionInputs, expected: dict[str, Any]) -> None:
    assert decide(given).model_dump(mode="json") == expected


@pytest.mark.parametrize(
    ("mode", "enabled", "consent", "skipped"),
    [
        ("trusted-auto", True, True, True),
        ("trusted-auto", True, False, False),
        ("trusted-auto", False, True, False),
        ("auto", True, True, False),
        ("review", True, True, False),
    ],
)
def test_only_enabled_and_consented_trusted_auto_skips_checks(
    mode: str, *, enabled: bool, consent: bool, skipped: bool
) -> None:
    assert skips_checks(mode, allow_trusted_auto=enabled, consent_trusted_auto=consent) is skipped
    # a requester that may not apply gets its checks run, whatever else holds
    denied = skips_checks(
        mode, allow_trusted_auto=enabled, consent_trusted_auto=consent, apply_denied=DENIED
    )
    assert denied is False


def test_a_conflict_leaves_the_diff_unapplied_and_says_why() -> None:
    decision = with_conflict(decide(inputs()), "app.py changed meanwhile")
    assert decision.model_dump(mode="json") == {
        "mode": "auto",
        "applied": False,
        "gates": ALL_GATES,
        "apply_conflict": "app.py changed meanwhile",
        "reason": "auto: every gate holds",
    }


def test_decide_is_pure() -> None:
    given = inputs(checks=[check("tests", "failed")])
    before = given.model_dump()
    assert decide(given) == decide(given)
    assert given.model_dump() == before


def test_an_undecided_record_stores_an_empty_object() -> None:
    from controller.jobs.records import JobRecord

    record = JobRecord(job_id="j", repo="/r")
    assert record.model_dump(mode="json")["decision"] == {}
    assert JobRecord.model_validate_json(record.model_dump_json()).decision is None
    decided = Decision(mode="review", reason=REVIEW)
    record.decision = decided
    assert JobRecord.model_validate_json(record.model_dump_json()).decision == decided
