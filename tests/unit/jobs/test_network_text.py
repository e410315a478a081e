"""``patchbox show``'s network section: the environment setup's requests (when the job built
its environment with egress) and each check's, in the job's evidence too."""

from __future__ import annotations

from pathlib import Path

from controller.jobs.evidence import bundle
from controller.jobs.records import EnvironmentRecord, JobRecord
from controller.jobs.summary import network_text

REQUEST = {
    "host": "index.example.net",
    "port": 443,
    "address": "203.0.113.5",
    "allowed": True,
    "reason": "",
    "status": 200,
    "bytes_out": 900,
    "bytes_in": 12000,
    "start": 1.0,
    "end": 2.0,
}


def test_the_setups_requests_are_shown_and_kept_in_the_evidence(tmp_path: Path) -> None:
    record = JobRecord(job_id="j", repo=str(tmp_path))
    assert network_text(record) == []
    built = {"tag": "t", "key": "k", "base": "b", "built": True, "seconds": 1.0}
    record.environment = EnvironmentRecord.model_validate(built)
    assert network_text(record) == []
    refused = REQUEST | {"host": "other.example.net", "allowed": False, "reason": "not_allowed"}
    with_requests = built | {"egress": ["index.example.net:443"], "network": [REQUEST, refused]}
    record.environment = EnvironmentRecord.model_validate(with_requests)
    assert network_text(record) == [
        "network (through the job's proxy):",
        "  environment setup: index.example.net:443 allowed, status 200, 900 B out, 12000 B in",
        (
            "  environment setup: other.example.net:443 refused (not_allowed), status 200, "
            "900 B out, 12000 B in"
        ),
    ]
    assert bundle(record, None)["environment"]["network"][0] == REQUEST
    # as the record keeps it: the same keys as before for a build without egress
    assert EnvironmentRecord.model_validate(built).model_dump(mode="json") == built | {"steps": []}
