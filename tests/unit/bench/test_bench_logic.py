"""The pure parts of two benchmarks: the peers' mixed tool sequence and the phases of a
traced CLI job (no Docker, no peer installed)."""

from __future__ import annotations

import sys
from collections import Counter

from tests.support.paths import BENCH

sys.path.insert(0, str(BENCH))

import pytest

from bench_floor import PHASES, phases_of
from bench_peers import mixed_sequence, repo_files
from common import SAMPLE_PATH


def test_the_mixed_sequence_has_100_calls_of_every_kind() -> None:
    steps = mixed_sequence()
    assert len(steps) == 100
    assert Counter(s.kind for s in steps) == {
        "read": 50,
        "list": 20,
        "search": 19,
        "write": 10,
        "run": 1,
    }
    assert steps[-1].kind == "run"


def test_every_step_names_something_the_repository_holds() -> None:
    files = repo_files()
    text = "".join(files.values())
    assert SAMPLE_PATH in files
    for step in mixed_sequence():
        if step.kind in {"read", "write"}:
            assert step.path in files
        if step.kind == "search":
            assert step.query in text


def test_phases_take_the_first_mark_and_skip_missing_ones() -> None:
    events = [
        ("spawn", 0.0),
        ("child", 0.05),
        ("imported", 0.55),
        ("settle>", 0.6),
        ("settle<", 0.7),
        ("settle>", 5.0),
        ("exit", 2.0),
    ]
    phases = phases_of(events)
    assert phases["interpreter start"] == 0.05
    assert phases["settle (reaper, job records)"] == 0.7 - 0.6
    assert "evidence" not in phases
    assert set(phases) <= {label for label, _begin, _end in PHASES}


def test_a_close_during_collection_is_not_the_teardown() -> None:
    teardown = "teardown (sandbox removal, on a thread of its own)"
    assert teardown in {label for label, _begin, _end in PHASES}
    events = [("collect>", 1.0), ("close>", 1.1), ("close<", 1.2), ("collect<", 1.3)]
    assert teardown not in phases_of(events)
    events += [("close>", 1.4), ("close<", 1.5)]
    assert phases_of(events)[teardown] == pytest.approx(0.1)
