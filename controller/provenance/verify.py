"""``patchbox verify``: a diff checked against its signed attestations, a public key and an
optional policy, offline, with nothing but patchbox installed.

Each rule that fails is reported with its code (:class:`Rule`); the diff is taken as it is,
or, for a ``git format-patch`` mail (what ``run --output-dir`` writes), as the diff the mail
carries (its message is not signed)."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
import time
from enum import StrEnum
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from securesystemslib.dsse import Envelope
from securesystemslib.signer import Key

from controller.errormap import describe_validation
from controller.errors import ErrorCode, PatchboxError
from controller.provenance import statement as st
from controller.provenance.envelope import read_envelopes, verified

MAX_INPUT_BYTES = 256 * 1024 * 1024
MAIL_HEADERS = (b"From: ", b"Date: ", b"Subject: ")
MAIL_JOB_LINE = re.compile(rb"patchbox job [0-9a-z-]{1,64}")
MAIL_TRAILER = re.compile(rb"\n-- \npatchbox [^\n]{1,200}\n\Z")


class Rule(StrEnum):
    """The codes of the rules ``patchbox verify`` checks, one per failure it reports."""

    SIGNATURE_INVALID = "SIGNATURE_INVALID"
    """An envelope is not signed by the given key (or its payload was changed)."""
    STATEMENT_INVALID = "STATEMENT_INVALID"
    """An envelope's payload is not an in-toto Statement v1 of patchbox's predicates."""
    PROVENANCE_MISSING = "PROVENANCE_MISSING"
    """Not exactly one provenance statement."""
    SUBJECT_MISMATCH = "SUBJECT_MISMATCH"
    """A statement's diff digest is not the diff's, or the statements name different trees."""
    JOB_MISMATCH = "JOB_MISMATCH"
    """A check's statement is of another job than the provenance."""
    CHECK_MISSING = "CHECK_MISSING"
    """A required check (the job's own, or one the policy names) has no statement."""
    CHECK_FAILED = "CHECK_FAILED"
    """A required check's statement says it did not pass."""
    POLICY_EXPIRED = "POLICY_EXPIRED"
    """The policy's ``expires`` is past, or the job ended outside ``max_age_hours``."""
    POLICY_VIOLATION = "POLICY_VIOLATION"
    """The provenance says something the policy does not allow (the field is named)."""


class Policy(BaseModel):
    """What a verifier requires beyond the signatures (every field optional)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    runtime: Literal["runc", "runsc"] | None = None
    egress: list[str] | None = Field(default=None, max_length=1024)
    """The ``host:port`` rules checks and setup may have had; ``[]``: none at all."""
    required_checks: list[str] = Field(default_factory=list, max_length=256)
    """Checks that must have been required and passed."""
    baseline_commit: str | None = Field(default=None, pattern=r"^[0-9a-f]{40}([0-9a-f]{24})?$")
    local_changes: bool | None = None
    """``false``: the baseline must be the commit itself, with no uncommitted work."""
    mode: str | None = None
    expires: dt.datetime | None = None
    """The policy is not valid after this time (RFC 3339)."""
    max_age_hours: float | None = Field(default=None, gt=0)
    """The job must have ended at most this long ago."""


class Failure(BaseModel):
    code: Rule
    message: str


class Report(BaseModel):
    """What ``patchbox verify`` found."""

    ok: bool
    job_id: str | None = None
    diff_sha256: str
    tree: str | None = None
    key_id: str
    checks: dict[str, str] = Field(default_factory=dict)
    """Each required check's result as its statement says."""
    failures: list[Failure] = Field(default_factory=list)


def _input(path: Path, what: str) -> bytes:
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_INPUT_BYTES + 1)
    except OSError as exc:
        msg = f"the {what} {str(path)!r} cannot be read: {exc.strerror}"
        raise PatchboxError(msg, code=ErrorCode.VERIFY_INPUT_INVALID) from exc
    if len(data) > MAX_INPUT_BYTES:
        msg = f"the {what} {str(path)!r} is larger than {MAX_INPUT_BYTES} bytes"
        raise PatchboxError(msg, code=ErrorCode.VERIFY_INPUT_INVALID)
    return data


def diff_bytes(data: bytes) -> bytes:
    """The diff itself: ``data``, or the diff a ``git format-patch`` mail of patchbox's
    carries (between its ``---`` line and its ``-- `` signature). A mail holds nothing else
    that ``git am`` would apply: its headers are ``From``, ``Date`` and ``Subject`` lines, its
    message lines are empty, indented by four spaces or the ``patchbox job`` line, and
    nothing follows the signature (``VERIFY_INPUT_INVALID`` otherwise)."""
    if not data.startswith(b"From "):
        return data
    head, _, rest = data.partition(b"\n\n")
    lines = head.split(b"\n")
    if not lines[0].startswith(b"From ") or not any(x.startswith(b"Subject: ") for x in lines):
        return data
    for number, line in enumerate(lines[1:], 2):
        if not line.startswith(MAIL_HEADERS):
            raise _not_a_mail(number)
    offset = len(head) + 2
    message = rest.split(b"\n")
    for number, line in enumerate(message, len(lines) + 2):
        if line == b"---":
            break
        offset += len(line) + 1
        if line and not line.startswith(b"    ") and not MAIL_JOB_LINE.fullmatch(line):
            raise _not_a_mail(number)
    else:
        raise _not_a_mail(len(lines) + len(message))
    trailer = MAIL_TRAILER.search(data)
    start = offset + len(b"---\n")
    if trailer is None or trailer.start() < start:
        msg = "the patch mail does not end with patchbox's signature (-- , patchbox VERSION)"
        raise PatchboxError(msg, code=ErrorCode.VERIFY_INPUT_INVALID)
    return data[start : trailer.start() + 1]


def _not_a_mail(line: int) -> PatchboxError:
    msg = (
        f"line {line} of the patch mail is outside its diff and could be applied by git am: "
        "the mail is not one patchbox wrote"
    )
    return PatchboxError(msg, code=ErrorCode.VERIFY_INPUT_INVALID)


def load_policy(path: Path) -> Policy:
    """The policy file (JSON); ``VERIFY_INPUT_INVALID`` naming what is wrong."""
    try:
        return Policy.model_validate_json(_input(path, "policy"))
    except ValidationError as exc:
        fields = describe_validation(exc, subject="", model=Policy, syntax="json")
        msg = f"the policy {str(path)!r} is not valid: {fields}"
        raise PatchboxError(msg, code=ErrorCode.VERIFY_INPUT_INVALID) from exc


def _statement(envelope: Envelope) -> st.Statement | None:
    if envelope.payload_type != st.PAYLOAD_TYPE:
        return None
    try:
        return st.Statement.model_validate_json(envelope.payload)
    except ValidationError:
        return None


class _Checker:
    def __init__(self, diff: bytes, key: Key) -> None:
        self.digest = hashlib.sha256(diff).hexdigest()
        self.report = Report(ok=False, diff_sha256=self.digest, key_id=key.keyid)

    def fail(self, code: Rule, message: str) -> None:
        self.report.failures.append(Failure(code=code, message=message))

    def subjects(self, number: int, statement: st.Statement) -> None:
        named = {s.name: s.digest for s in statement.subject}
        diff = named.get(st.DIFF_SUBJECT, {}).get("sha256")
        if diff != self.digest:
            self.fail(
                Rule.SUBJECT_MISMATCH,
                f"statement {number} is of a diff with SHA-256 {diff}, not this one's "
                f"({self.digest})",
            )
        tree = named.get(st.TREE_SUBJECT, {}).get("gitTree")
        if self.report.tree is None:
            self.report.tree = tree
        elif tree != self.report.tree:
            self.fail(Rule.SUBJECT_MISMATCH, f"statement {number} names another tree ({tree})")


def verify(
    diff: bytes, attestations: str, key: Key, policy: Policy | None = None, now: float | None = None
) -> Report:
    """Every rule checked; the report lists each failure (``ok`` when there is none)."""
    checker = _Checker(diff, key)
    provenances: list[st.Provenance] = []
    results: dict[str, list[tuple[st.TestResult, st.Descriptor]]] = {}
    for number, envelope in enumerate(read_envelopes(attestations), 1):
        if not verified(envelope, key):
            checker.fail(
                Rule.SIGNATURE_INVALID, f"envelope {number} is not signed by key {key.keyid}"
            )
            continue
        statement = _statement(envelope)
        try:
            if statement is None:
                raise ValueError  # noqa: TRY301 - one message for both
            if statement.predicate_type == st.PROVENANCE_TYPE:
                provenances.append(st.Provenance.model_validate(statement.predicate))
            elif statement.predicate_type == st.TEST_RESULT_TYPE:
                result = st.TestResult.model_validate(statement.predicate)
                check = next(c for c in result.configuration if c.name.startswith(st.CHECK_PREFIX))
                results.setdefault(check.name.removeprefix(st.CHECK_PREFIX), []).append(
                    (result, check)
                )
            else:
                raise ValueError  # noqa: TRY301
        except (ValueError, StopIteration):
            checker.fail(
                Rule.STATEMENT_INVALID,
                f"envelope {number} holds no in-toto statement of patchbox's predicates",
            )
            continue
        checker.subjects(number, statement)
    if len(provenances) != 1:
        checker.fail(
            Rule.PROVENANCE_MISSING,
            f"{len(provenances)} provenance statements were found (one is expected)",
        )
    else:
        _job(checker, provenances[0], results, policy, now)
    checker.report.ok = not checker.report.failures
    return checker.report


def _job(
    checker: _Checker,
    provenance: st.Provenance,
    results: dict[str, list[tuple[st.TestResult, st.Descriptor]]],
    policy: Policy | None,
    now: float | None,
) -> None:
    job_id = provenance.run_details.metadata.invocation_id
    checker.report.job_id = job_id
    required = provenance.build_definition.external_parameters.required_checks
    wanted = sorted({*required, *(policy.required_checks if policy else [])})
    for cid, found in sorted(results.items()):
        for _, check in found:
            annotations = check.annotations or {}
            if annotations.get("job") != job_id:
                checker.fail(
                    Rule.JOB_MISMATCH,
                    f"the statement of check {cid!r} is of job {annotations.get('job')!r}, "
                    f"not {job_id!r}",
                )
        if cid not in required:
            checker.fail(Rule.JOB_MISMATCH, f"check {cid!r} was not one of the job's required")
    for cid in wanted:
        found = results.get(cid, [])
        if cid not in required or len(found) != 1:
            checker.fail(
                Rule.CHECK_MISSING,
                f"required check {cid!r} has {len(found)} statements"
                + ("" if cid in required else " and the job did not require it"),
            )
            continue
        result = found[0][0].result
        checker.report.checks[cid] = result
        if result != "PASSED":
            checker.fail(Rule.CHECK_FAILED, f"required check {cid!r} did not pass ({result})")
    if policy is not None:
        _policy(checker, provenance, policy, time.time() if now is None else now)


def _policy(checker: _Checker, provenance: st.Provenance, policy: Policy, now: float) -> None:
    _timing(checker, provenance, policy, dt.datetime.fromtimestamp(now, dt.UTC))
    for field, message in _contents(provenance.build_definition, policy):
        checker.fail(Rule.POLICY_VIOLATION, f"policy.{field}: {message}")


def _timing(
    checker: _Checker, provenance: st.Provenance, policy: Policy, clock: dt.datetime
) -> None:
    if policy.expires is not None:
        expires = policy.expires
        if expires.tzinfo is None:
            expires = expires.replace(tzinfo=dt.UTC)
        if clock > expires:
            message = f"policy.expires: the policy expired at {expires.isoformat()}"
            checker.fail(Rule.POLICY_EXPIRED, message)
    if policy.max_age_hours is not None:
        finished = dt.datetime.fromisoformat(provenance.run_details.metadata.finished_on)
        age = (clock - finished).total_seconds() / 3600
        if age > policy.max_age_hours:
            checker.fail(
                Rule.POLICY_EXPIRED,
                f"policy.max_age_hours: the job ended {age:.1f} hours ago "
                f"(at most {policy.max_age_hours:g})",
            )


def _contents(definition: st.BuildDefinition, policy: Policy) -> list[tuple[str, str]]:
    internal, external = definition.internal_parameters, definition.external_parameters
    wrong: list[tuple[str, str]] = []
    if policy.runtime is not None and internal.runtime != policy.runtime:
        wrong.append(("runtime", f"the job ran under {internal.runtime!r}, not {policy.runtime!r}"))
    if policy.egress is not None:
        declared = {e for rules in internal.network.egress.values() for e in rules}
        declared |= set(internal.network.setup)
        extra = sorted(declared - set(policy.egress))
        if extra:
            wrong.append(("egress", "the job could reach " + ", ".join(extra)))
    baseline = external.baseline
    if policy.baseline_commit is not None and baseline.commit != policy.baseline_commit:
        wrong.append(("baseline_commit", f"the baseline is commit {baseline.commit}"))
    if policy.local_changes is not None and baseline.local_changes != policy.local_changes:
        had = "included" if baseline.local_changes else "did not include"
        wrong.append(("local_changes", f"the baseline {had} uncommitted changes"))
    if policy.mode is not None and external.mode != policy.mode:
        wrong.append(("mode", f"the job's mode was {external.mode!r}"))
    return wrong


def verify_files(diff: Path, attestations: Path, key: Key, policy: Path | None = None) -> Report:
    """:func:`verify` of the files named (``VERIFY_INPUT_INVALID`` for one that cannot be
    read or parsed)."""
    text = _input(attestations, "attestations").decode("utf-8", "replace")
    return verify(
        diff_bytes(_input(diff, "diff")),
        text,
        key,
        load_policy(policy) if policy is not None else None,
    )


def as_json(report: Report) -> str:
    return json.dumps(report.model_dump(mode="json"), indent=2, sort_keys=True)
