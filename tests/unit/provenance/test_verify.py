"""Signed provenance, pure: a decided job's attestations verify (with patchbox's verifier and
with the in-toto project's own tooling), and each tampering fails with its exact rule: one
changed byte of the diff, a swapped or forged check result, an attestation of another job,
a wrong key, a policy that expired or that the job does not meet."""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path

import pytest
from in_toto.models.metadata import SignatureVerificationError
from securesystemslib.signer import CryptoSigner

from controller.errors import ErrorCode, PatchboxError
from controller.jobs.attest import attest, statements
from controller.jobs.records import JobRecord
from controller.jobs.store import ATTESTATIONS, JobStore
from controller.provenance.envelope import signed_lines
from controller.provenance.keys import init_key, load_signer, public_pem
from controller.provenance.verify import Policy, Report, Rule, diff_bytes, verify, verify_files
from tests.support.provenance import (
    DIFF,
    decided_record,
    independently_verified,
    payloads,
    public_key,
)


@pytest.fixture
def key(tmp_path: Path) -> Path:
    return init_key(tmp_path / "keys" / "provenance.key")


def _signed(record: JobRecord, key: Path, diff: str = DIFF) -> str:
    assert record.provenance is not None
    made = statements(record, record.provenance, diff.encode())
    return signed_lines(made, load_signer(key)).decode()


def _check(
    lines: str, key: Path, diff: str = DIFF, policy: Policy | None = None, now: float | None = None
) -> Report:
    return verify(diff.encode(), lines, public_key(public_pem(key).encode()), policy, now)


def _codes(report: Report) -> list[str]:
    return [f.code for f in report.failures]


def test_a_jobs_attestations_verify(tmp_path: Path, key: Path) -> None:
    lines = _signed(decided_record(tmp_path / "repo"), key)
    report = _check(lines, key)
    assert (report.ok, report.failures) == (True, [])
    assert report.job_id == "20261207-000000-aaaaaaaa"
    assert report.tree == "d" * 40
    assert report.checks == {"lint": "PASSED", "tests": "PASSED"}
    assert independently_verified(lines, public_pem(key).encode()) == [
        "https://slsa.dev/provenance/v1",
        "https://in-toto.io/attestation/test-result/v0.1",
        "https://in-toto.io/attestation/test-result/v0.1",
    ]


def test_the_independent_verifier_refuses_a_forged_envelope(tmp_path: Path, key: Path) -> None:
    lines = _signed(decided_record(tmp_path / "repo"), key).splitlines()
    envelope = json.loads(lines[1])
    statement = json.loads(base64.b64decode(envelope["payload"]))
    statement["predicate"]["result"] = "FAILED"
    envelope["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    with pytest.raises(SignatureVerificationError):
        independently_verified(json.dumps(envelope), public_pem(key).encode())


def test_one_changed_byte_of_the_diff_fails_the_subject(tmp_path: Path, key: Path) -> None:
    lines = _signed(decided_record(tmp_path / "repo"), key)
    changed = DIFF.replace("+Hello", "+Hellp")
    report = _check(lines, key, diff=changed)
    assert not report.ok
    assert set(_codes(report)) == {Rule.SUBJECT_MISMATCH}
    assert len(report.failures) == 3  # every statement names the diff


def test_a_forged_check_result_fails_its_signature(tmp_path: Path, key: Path) -> None:
    record = decided_record(tmp_path / "repo", checks={"tests": "failed"})
    lines = _signed(record, key).splitlines()
    envelope = json.loads(lines[1])
    statement = json.loads(base64.b64decode(envelope["payload"]))
    assert statement["predicate"]["result"] == "FAILED"
    statement["predicate"]["result"] = "PASSED"
    envelope["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    report = _check("\n".join([lines[0], json.dumps(envelope)]), key)
    assert _codes(report) == [Rule.SIGNATURE_INVALID, Rule.CHECK_MISSING]


def test_a_check_result_swapped_from_another_job_fails(tmp_path: Path, key: Path) -> None:
    failing = decided_record(tmp_path / "repo", checks={"tests": "failed"})
    passing = decided_record(
        tmp_path / "repo", "20261207-000001-bbbbbbbb", checks={"tests": "passed"}
    )
    own = _signed(failing, key).splitlines()
    other = _signed(passing, key).splitlines()
    assert _codes(_check("\n".join(own), key)) == [Rule.CHECK_FAILED]
    report = _check("\n".join([own[0], other[1]]), key)
    assert _codes(report) == [Rule.JOB_MISMATCH]
    assert "20261207-000001-bbbbbbbb" in report.failures[0].message


def test_an_attestation_of_another_job_fails(tmp_path: Path, key: Path) -> None:
    record = decided_record(tmp_path / "repo")
    other = decided_record(tmp_path / "repo", "20261207-000002-cccccccc")
    assert other.provenance is not None
    other.provenance = other.provenance.model_copy(update={"result_tree": "9" * 40})
    mine = _signed(record, key).splitlines()
    theirs = _signed(other, key, diff=DIFF.replace("Hello", "HELLO")).splitlines()
    report = _check("\n".join([mine[0], *theirs[1:]]), key)
    codes = set(_codes(report))
    assert {Rule.SUBJECT_MISMATCH, Rule.JOB_MISMATCH} <= codes
    assert Rule.SIGNATURE_INVALID not in codes
    both = _check("\n".join([*mine, theirs[0]]), key)
    assert Rule.PROVENANCE_MISSING in _codes(both)


def test_a_wrong_key_fails_every_signature(tmp_path: Path, key: Path) -> None:
    lines = _signed(decided_record(tmp_path / "repo"), key)
    other = init_key(tmp_path / "other.key")
    report = _check(lines, other)
    assert _codes(report)[:3] == [Rule.SIGNATURE_INVALID] * 3
    assert Rule.PROVENANCE_MISSING in _codes(report)


def test_a_missing_or_failed_required_check_fails(tmp_path: Path, key: Path) -> None:
    lines = _signed(decided_record(tmp_path / "repo"), key).splitlines()
    report = _check("\n".join(lines[:2]), key)  # the lint statement left out
    assert _codes(report) == [Rule.CHECK_MISSING]
    assert "'tests'" in report.failures[0].message or "'lint'" in report.failures[0].message
    failed = _signed(decided_record(tmp_path / "repo", checks={"tests": "failed"}), key)
    assert _codes(_check(failed, key)) == [Rule.CHECK_FAILED]


def test_policy_rules_fail_by_name(tmp_path: Path, key: Path) -> None:
    record = decided_record(tmp_path / "repo", runtime="runc", egress=["pypi.org:443"])
    lines = _signed(record, key)
    policy = Policy(
        runtime="runsc",
        egress=[],
        required_checks=["tests", "lint", "types"],
        baseline_commit="1" * 40,
        local_changes=False,
        mode="review",
    )
    report = _check(lines, key, policy=policy)
    messages = [(f.code, f.message.split(":")[0]) for f in report.failures]
    assert messages == [
        (
            Rule.CHECK_MISSING,
            "required check 'types' has 0 statements and the job did not require it",
        ),
        (Rule.POLICY_VIOLATION, "policy.runtime"),
        (Rule.POLICY_VIOLATION, "policy.egress"),
        (Rule.POLICY_VIOLATION, "policy.baseline_commit"),
    ]
    good = Policy(
        runtime="runc",
        egress=["pypi.org:443"],
        required_checks=["tests"],
        baseline_commit="a" * 40,
        local_changes=False,
    )
    assert _check(lines, key, policy=good).ok


def test_an_expired_policy_or_an_old_job_fails(tmp_path: Path, key: Path) -> None:
    record = decided_record(tmp_path / "repo")
    lines = _signed(record, key)
    now = time.time()
    expired = Policy.model_validate({"expires": "2020-01-01T00:00:00Z"})
    report = _check(lines, key, policy=expired, now=now)
    assert _codes(report) == [Rule.POLICY_EXPIRED]
    assert report.failures[0].message.startswith("policy.expires")
    fresh = Policy(max_age_hours=1)
    assert _check(lines, key, policy=fresh, now=record.updated_at + 60).ok
    old = _check(lines, key, policy=fresh, now=record.updated_at + 7200)
    assert _codes(old) == [Rule.POLICY_EXPIRED]
    assert old.failures[0].message.startswith("policy.max_age_hours")


MAIL_HEAD = (
    "From 0000 Mon Sep 17 00:00:00 2001\nFrom: patchbox <patchbox@localhost>\n"
    "Date: Mon, 07 Dec 2026 00:00:00 +0000\nSubject: [PATCH] fix\n\n"
)
MAIL = MAIL_HEAD + "    body\n\npatchbox job 20261207-000000-aaaaaaaa\n---\n" + DIFF
MAIL += "-- \npatchbox 0.1.0\n"
EVIL = "diff --git a/evil.sh b/evil.sh\n--- /dev/null\n+++ b/evil.sh\n@@ -0,0 +1 @@\n+boom\n"


def test_a_format_patch_mail_is_checked_by_its_diff() -> None:
    assert diff_bytes(MAIL.encode()) == DIFF.encode()
    assert diff_bytes(DIFF.encode()) == DIFF.encode()
    assert diff_bytes(MAIL.replace("+Hello", "+Hellp").encode()) != DIFF.encode()
    # a separator of its own before the real one: what follows is not the signed diff
    early = MAIL.replace("    body\n", "    body\n---\n" + EVIL)
    assert diff_bytes(early.encode()) != DIFF.encode()
    bare = MAIL_HEAD + "patchbox job 20261207-000000-aaaaaaaa\n---\n" + DIFF
    assert diff_bytes((bare + "-- \npatchbox 0.1.0\n").encode()) == DIFF.encode()


@pytest.mark.parametrize(
    "mail",
    [
        MAIL.replace("    body\n", EVIL),  # a second patch git am would apply, in the message
        MAIL.replace("Subject: [PATCH] fix\n", "Subject: [PATCH] fix\nX-Evil: 1\n"),
        MAIL + EVIL,  # after the signature
        MAIL.replace("-- \npatchbox 0.1.0\n", ""),  # no signature: where the diff ends is unsaid
    ],
    ids=["patch-in-message", "extra-header", "after-signature", "unsigned"],
)
def test_a_mail_that_carries_more_than_its_diff_is_refused(mail: str) -> None:
    with pytest.raises(PatchboxError) as info:
        diff_bytes(mail.encode())
    assert info.value.code is ErrorCode.VERIFY_INPUT_INVALID


def test_bad_inputs_are_refused_with_their_code(tmp_path: Path, key: Path) -> None:
    diff = tmp_path / "diff.patch"
    diff.write_text(DIFF)
    pub = public_key(public_pem(key).encode())
    lines = tmp_path / "a.jsonl"
    for content in ["", "not json\n", '{"payload": 1}\n']:
        lines.write_text(content)
        with pytest.raises(PatchboxError) as info:
            verify_files(diff, lines, pub)
        assert info.value.code is ErrorCode.VERIFY_INPUT_INVALID
    with pytest.raises(PatchboxError) as missing:
        verify_files(tmp_path / "none.patch", lines, pub)
    assert missing.value.code is ErrorCode.VERIFY_INPUT_INVALID
    lines.write_text(_signed(decided_record(tmp_path / "repo"), key))
    policy = tmp_path / "policy.json"
    policy.write_text('{"runtime": "kvm", "unknown": 1}')
    with pytest.raises(PatchboxError) as bad:
        verify_files(diff, lines, pub, policy)
    assert bad.value.code is ErrorCode.VERIFY_INPUT_INVALID
    assert "runtime" in bad.value.message
    assert "unknown" in bad.value.message


def test_keys_are_private_and_checked(tmp_path: Path) -> None:
    path = init_key(tmp_path / "k" / "provenance.key")
    assert path.stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "k").stat().st_mode & 0o777 == 0o700
    assert (tmp_path / "k" / "provenance.pub").read_text() == public_pem(path)
    with pytest.raises(PatchboxError) as exists:
        init_key(path)
    assert exists.value.code is ErrorCode.SIGNING_KEY_EXISTS
    path.chmod(0o644)
    with pytest.raises(PatchboxError) as readable:
        load_signer(path)
    assert (readable.value.code, "0644" in readable.value.message) == (
        ErrorCode.SIGNING_KEY_INVALID,
        True,
    )
    garbage = tmp_path / "garbage.key"
    garbage.write_text("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")
    garbage.chmod(0o600)
    with pytest.raises(PatchboxError) as invalid:
        load_signer(garbage)
    assert invalid.value.code is ErrorCode.SIGNING_KEY_INVALID
    with pytest.raises(PatchboxError) as missing:
        load_signer(tmp_path / "none.key")
    assert missing.value.code is ErrorCode.SIGNING_KEY_MISSING
    ecdsa = init_key(tmp_path / "ec.key", scheme="ecdsa-p256")
    assert isinstance(load_signer(ecdsa), CryptoSigner)


def test_an_ecdsa_key_signs_what_verifies(tmp_path: Path) -> None:
    key = init_key(tmp_path / "ec.key", scheme="ecdsa-p256")
    lines = _signed(decided_record(tmp_path / "repo"), key)
    assert _check(lines, key).ok
    assert len(independently_verified(lines, public_pem(key).encode())) == 3


def test_attest_scrubs_secrets_and_host_paths_and_signs_once(
    tmp_path: Path, key: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATCHBOX_HOME", str(tmp_path / "home"))
    repo = tmp_path / "work" / "my-repo"
    record = decided_record(repo)
    assert record.provenance is not None
    secret = "sk-live-0123456789abcdef"  # noqa: S105 - a made-up secret to scrub
    checks = {
        "tests": record.provenance.checks["tests"].model_copy(
            update={"argv": ["python3", str(repo / "run.py"), "--token", secret]}
        )
    }
    record.provenance = record.provenance.model_copy(update={"checks": checks})
    record.checks = [c for c in record.checks if c.id == "tests"]
    store = JobStore()
    target = attest(record, DIFF, store, load_signer(key), secrets=(secret,))
    assert target == store.folder(record.job_id) / ATTESTATIONS
    text = target.read_text()
    for statement in payloads(text):
        dumped = json.dumps(statement)
        assert secret not in dumped
        assert str(tmp_path) not in dumped
    assert record.provenance.key_id == load_signer(key).public_key.keyid
    assert _check(text, key).ok
    before = target.read_bytes()
    record.checks = []
    assert attest(record, DIFF, store, load_signer(key)) == target
    assert target.read_bytes() == before


def test_nothing_is_signed_without_a_key_a_decision_or_a_diff(
    tmp_path: Path, key: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATCHBOX_HOME", str(tmp_path / "home"))
    store = JobStore()
    record = decided_record(tmp_path / "repo")
    assert attest(record, DIFF, store, None) is None
    assert attest(record, "", store, load_signer(key)) is None
    record.decision = None
    assert attest(record, DIFF, store, load_signer(key)) is None
    assert not (store.folder(record.job_id) / ATTESTATIONS).exists()
