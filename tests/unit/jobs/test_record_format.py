"""``job.json`` keeps its format: records written before the record was typed (tests/data/
records_v1, one per decision shape) load, and are written back byte for byte. No Docker."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.jobs.records import JobRecord
from tests.support.paths import DATA

RECORDS = sorted((DATA / "records_v1").glob("*.json"))


def test_there_are_records_to_read() -> None:
    assert len(RECORDS) == 4


@pytest.mark.parametrize("path", RECORDS, ids=[p.stem for p in RECORDS])
def test_an_older_record_loads_and_is_rewritten_as_it_was(path: Path) -> None:
    raw = path.read_text()
    record = JobRecord.model_validate_json(raw)
    assert record.model_dump_json(indent=2) == raw
    assert record.decision is not None
    assert all(f.calls for f in record.files)
