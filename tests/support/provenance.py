"""Helpers of the provenance tests: a decided job's record (pure), its attestations signed
with a fresh key, and an independent verifier (the in-toto project's own tooling)."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.serialization import load_pem_public_key
from google.protobuf import json_format
from in_toto.models.metadata import Metadata
from in_toto_attestation.predicates.provenance.v1 import provenance_pb2
from in_toto_attestation.predicates.test_result.v0 import test_result_pb2
from in_toto_attestation.v1 import statement_pb2
from in_toto_attestation.v1.statement import Statement
from securesystemslib.signer import SSlibKey

from controller.jobs.records import CheckFact, CheckResult, Decision, JobRecord, ProvenanceFacts
from controller.repo.baseline import Baseline
from controller.repo.health import Counts

DIFF = (
    "diff --git a/app.py b/app.py\n"
    "index 1111111..2222222 100644\n"
    "--- a/app.py\n"
    "+++ b/app.py\n"
    "@@ -1 +1 @@\n"
    "-hello\n"
    "+Hello\n"
)
HEAD = "a" * 40


def decided_record(
    repo: Path,
    job_id: str = "20261207-000000-aaaaaaaa",
    *,
    checks: dict[str, str] | None = None,
    runtime: str = "runsc",
    egress: list[str] | None = None,
) -> JobRecord:
    """A job awaiting review with ``checks`` (id: status) required and run."""
    results = checks if checks is not None else {"tests": "passed", "lint": "passed"}
    record = JobRecord(
        job_id=job_id,
        repo=str(repo),
        task={"prompt": "fix it", "limits": {"memory_mb": 512}},
        runtime=runtime,
        baseline=Baseline(
            repo=str(repo),
            mode="require-clean",
            head=HEAD,
            tree="b" * 40,
            commit=HEAD,
            local_digest="c" * 64,
            counts=Counts(),
            submodules=[],
            private_git_dir=str(repo / ".private"),
            built_ms=3,
        ),
        checks=[
            CheckResult(
                id=cid,
                status=status,  # type: ignore[arg-type]
                exit_code=0 if status == "passed" else 1,
                duration_ms=10,
                output_tail="",
                required=True,
                source="docker-exec",
                diff_sha256=hashlib.sha256(DIFF.encode()).hexdigest(),
            )
            for cid, status in results.items()
        ],
        decision=Decision(mode="review", reason="awaiting review"),
    )
    record.provenance = ProvenanceFacts(
        result_tree="d" * 40,
        sandbox_image="sha256:" + "e" * 64,
        agent_digest="f" * 64,
        rules_digest="0" * 64,
        checks={
            cid: CheckFact(argv=["python3", "-m", cid], egress=list(egress or []))
            for cid in results
        },
    )
    return record


def public_key(pem: bytes) -> SSlibKey:
    return SSlibKey.from_crypto(load_pem_public_key(pem))


def payloads(lines: bytes | str) -> list[dict[str, Any]]:
    """The statements of an attestations file (not verified)."""
    text = lines.decode() if isinstance(lines, bytes) else lines
    return [
        json.loads(base64.b64decode(json.loads(line)["payload"]))
        for line in text.splitlines()
        if line.strip()
    ]


def independently_verified(lines: str, pem: bytes) -> list[str]:
    """Each envelope checked by in-toto's own ``Metadata`` and key model, its payload parsed
    strictly by the in-toto attestation framework's protobuf schemas (statement, SLSA
    provenance v1, test result); returns the predicate types. Raises on any failure."""
    key = public_key(pem)
    found = []
    for line in lines.splitlines():
        if not line.strip():
            continue
        envelope = Metadata.from_dict(json.loads(line))
        envelope.verify_signature({**key.to_dict(), "keyid": key.keyid})
        statement = json_format.Parse(envelope.payload, statement_pb2.Statement())
        Statement.copy_from_pb(statement).validate()
        data = json.loads(envelope.payload)
        schema: Any = (
            provenance_pb2.Provenance()
            if data["predicateType"] == "https://slsa.dev/provenance/v1"
            else test_result_pb2.TestResult()
        )
        json_format.ParseDict(data["predicate"], schema)
        found.append(str(statement.predicate_type))
    return found
