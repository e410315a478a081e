"""The job record on disk as an append-only log (``controller/jobs/log.py``): every field
round-trips, a save appends only what is new, a crash's leftovers are dropped, records of
format 1 (``job.json``) load, and saves from several processes lose nothing. No Docker."""

from __future__ import annotations

import json
import multiprocessing
import shutil
import socket
import time
from pathlib import Path

import pytest

from controller.errorinfo import ErrorInfo
from controller.errors import UsageError
from controller.jobs.junit import TestCase
from controller.jobs.log import LOG_FILE, RecordLogError
from controller.jobs.records import (
    AttemptLink,
    BaselineCheck,
    CheckChange,
    CheckFact,
    CheckResult,
    ControlLine,
    Decision,
    EnvironmentRecord,
    FileChange,
    JobRecord,
    LedgerEntry,
    LedgerFile,
    ParentLink,
    ProvenanceFacts,
    ServiceRecord,
    StaleMark,
    ToolCallRecord,
    TranscriptCall,
    TranscriptTurn,
)
from controller.jobs.store import LEGACY_FILE, JobStore, mark_interrupted
from tests.support.paths import DATA

RECORDS_V1 = sorted((DATA / "records_v1").glob("*.json"))
RESULT = json.dumps({"ok": True, "result": {"content": "x = 1\n" * 2000}})


def turn(n: int, result: str = RESULT) -> TranscriptTurn:
    call = TranscriptCall(
        id=f"c{n}", name="read_file", arguments='{"path": "a.py"}', ok=True, result=result
    )
    return TranscriptTurn(turn=n, text=f"turn {n}", usage={"input": n}, model_ms=n, calls=[call])


def call_record(n: int, who: str = "") -> ToolCallRecord:
    return ToolCallRecord(turn=n, id=f"{who}c{n}", name="read_file", ok=True)


def add_turn(record: JobRecord, n: int) -> None:
    record.tool_calls.append(call_record(n))
    record.transcript.append(turn(n))


def full_record() -> JobRecord:
    """A record with every field set (from a record of format 1, plus what it lacks)."""
    record = JobRecord.model_validate_json(RECORDS_V1[0].read_bytes())
    record.environment = EnvironmentRecord(
        tag="patchbox-env:1", key="k", base="b", built=True, seconds=1.5
    )
    record.error = ErrorInfo(code="CHECK_FAILED", message="a check failed")
    record.parent = ParentLink(job_id="parent", diff_sha256="0" * 64, relation="follow-up")
    record.stale = StaleMark(by="child", reason="rebased", at=1.5)
    record.attempt = AttemptLink(index=2, job_ids=["a", "b"])
    record.provenance = ProvenanceFacts(
        result_tree="1" * 40,
        sandbox_image="sha256:" + "2" * 64,
        agent_digest="3" * 64,
        rules_digest="4" * 64,
        checks={"tests": CheckFact(argv=["pytest"], egress=["pypi.org:443"])},
        setup_egress=["pypi.org:443"],
        key_id="5" * 64,
    )
    record.tool_calls.append(
        ToolCallRecord(
            turn=9, id="c9", name="run_check", ok=False, error_code="X", error_message="no"
        )
    )
    record.transcript = [turn(1), TranscriptTurn(turn=2, text=None)]
    record.ledger.append(
        LedgerEntry(
            turn=9,
            id="c9",
            tool="run_check",
            intent="check",
            version_before=3,
            files=[LedgerFile(path="a.py")],
            outcome="unknown",
        )
    )
    record.control_characters = [ControlLine(path="a.py", line=3, characters=["\\x1b"])]
    case = TestCase(classname="t", name="one", status="failed", message="m", text="t")
    record.checks.append(
        CheckResult(
            id="unit",
            status="failed",
            exit_code=1,
            duration_ms=5,
            output_tail="F\n",
            diff_sha256="0" * 64,
            required=True,
            source="docker-exec",
            tests=[case],
            junit_error="too large",
        )
    )
    record.baseline_checks = [
        BaselineCheck(
            id="unit", status="cannot_run", exit_code=127, duration_ms=3, output_tail="", reason="r"
        )
    ]
    record.decision = Decision(
        mode="auto",
        gates={"checks": False},
        reason="r",
        failed_checks=["unit"],
        still_failing=["lint"],
        check_changes=[
            CheckChange(id="lint", before="failed", after="failed", change="still_failing")
        ],
        apply_conflict="c",
        applied_by="user",
        merged=["a.py"],
    )
    record.services = [
        ServiceRecord(
            name="db",
            image="patchbox-env:2",
            image_id="sha256:1",
            sandbox="checks",
            ready_seconds=1.5,
            exit="exited 1",
            log_tail="bye\n",
        )
    ]
    record.final_message = "done"
    record.diagnostics["reasons"] = [{"code": "R", "detail": "d"}]
    return record


def test_every_field_round_trips(tmp_path: Path) -> None:
    record = full_record()
    set_fields = {k for k, v in record.model_dump().items() if v not in (None, [], {}, "")}
    assert set_fields == set(JobRecord.model_fields)  # nothing left at its default
    JobStore(tmp_path).save(record)
    loaded = JobStore(tmp_path).load(record.job_id)
    assert loaded == record
    assert loaded.model_dump_json(indent=2) == record.model_dump_json(indent=2)


def test_a_record_changed_after_each_save_reads_back_as_the_last_save_left_it(
    tmp_path: Path,
) -> None:
    store = JobStore(tmp_path)
    record = JobRecord(job_id="j1", repo="/r", task={"prompt": "p"})
    store.save(record)
    for state in ("preparing", "running"):
        record.move(state)
        store.save(record)
    record.environment = EnvironmentRecord(tag="t", key="k", base="b", built=False, seconds=0.1)
    record.diagnostics["baseline_source"] = "spare"  # changed in place
    record.timings_ms["prepare"] = 12
    add_turn(record, 1)
    store.save(record, durable=False)
    record.environment = None
    record.files = [FileChange(path="a", kind="modify", added=1, removed=0)]
    store.save(record)
    record.files = [FileChange(path="b", kind="create", added=2, removed=0)]  # replaced whole
    record.checks = []
    store.save(record)
    again = JobStore(tmp_path).load("j1")
    assert again == record
    assert again.environment is None
    assert [f.path for f in again.files] == ["b"]


def test_a_save_appends_only_what_is_new(tmp_path: Path) -> None:
    """The bytes a save writes are the new entries (plus one short line), however long the
    job already is: the record grows linearly with the transcript."""
    store = JobStore(tmp_path)
    record = JobRecord(job_id="j1", repo="/r", task={"prompt": "p" * 2000})
    store.save(record)
    log = store.folder("j1") / LOG_FILE
    first = log.stat().st_size
    overheads: set[int] = set()
    for n in range(1, 301):
        add_turn(record, n)
        before = log.stat().st_size
        saved = store.save(record, durable=False)
        grown = log.stat().st_size - before
        assert saved.bytes == grown
        new = len(record.transcript[-1].model_dump_json())
        new += len(record.tool_calls[-1].model_dump_json())
        overheads.add(grown - new)
    assert len(overheads) == 1  # turn 300 costs its entries and what turn 1 did besides
    assert 0 < overheads.pop() <= 100  # the entries' keys and the "saved" line
    entries = sum(len(t.model_dump_json()) for t in record.transcript)
    entries += sum(len(c.model_dump_json()) for c in record.tool_calls)
    assert log.stat().st_size <= first + entries + 100 * 300


def test_a_torn_last_line_is_dropped(tmp_path: Path) -> None:
    store = JobStore(tmp_path)
    record = JobRecord(job_id="j1", repo="/r")
    add_turn(record, 1)
    store.save(record)
    log = store.folder("j1") / LOG_FILE
    whole = log.read_bytes()
    with log.open("ab") as out:
        out.write(b'{"add":"tool_calls","item":{"turn":2,"id":"c2","na')  # the crash
    assert JobStore(tmp_path).load("j1") == record
    again = JobStore(tmp_path).load("j1")
    add_turn(again, 2)
    JobStore(tmp_path).save(again)  # cuts the torn line off first
    assert log.read_bytes().startswith(whole)
    assert JobStore(tmp_path).load("j1") == again
    assert [c.id for c in JobStore(tmp_path).load("j1").tool_calls] == ["c1", "c2"]


def test_a_save_cut_short_counts_for_nothing(tmp_path: Path) -> None:
    """Entries without the ``saved`` line that ends their save (a writer killed half way,
    or one still writing) are not part of the record, and the next save drops them."""
    store = JobStore(tmp_path)
    record = JobRecord(job_id="j1", repo="/r")
    store.save(record)
    record.move("preparing")
    add_turn(record, 1)
    store.save(record)
    log = store.folder("j1") / LOG_FILE
    lines = log.read_bytes().splitlines(keepends=True)
    assert lines[-1].startswith(b'{"saved":{')
    log.write_bytes(b"".join(lines[:-1]))  # the last save without its last line
    before = JobStore(tmp_path).load("j1")
    assert before.state == "created"
    assert before.history == []
    assert before.tool_calls == []
    before.move("failed")
    JobStore(tmp_path).save(before)
    after = JobStore(tmp_path).load("j1")
    assert after == before
    assert [s for s, _ in after.history] == ["failed"]


def test_a_broken_line_inside_the_log_is_an_error_and_jobs_skips_it(tmp_path: Path) -> None:
    store = JobStore(tmp_path)
    for job_id in ("good", "bad"):
        record = JobRecord(job_id=job_id, repo="/r")
        add_turn(record, 1)
        store.save(record)
        add_turn(record, 2)
        store.save(record)
    log = store.folder("bad") / LOG_FILE
    lines = log.read_bytes().splitlines(keepends=True)
    lines[2] = b"not json\n"
    log.write_bytes(b"".join(lines))
    with pytest.raises(RecordLogError, match="not JSON"):
        JobStore(tmp_path).load("bad")
    assert [r.job_id for r in JobStore(tmp_path).all()] == ["good"]


def test_a_newer_record_format_is_refused_clearly(tmp_path: Path) -> None:
    store = JobStore(tmp_path)
    store.save(JobRecord(job_id="j1", repo="/r"))
    log = store.folder("j1") / LOG_FILE
    log.write_bytes(log.read_bytes().replace(b'{"record_format":2}', b'{"record_format":3}'))
    with pytest.raises(UsageError, match="record format 3; this patchbox reads formats 1"):
        JobStore(tmp_path).load("j1")
    with pytest.raises(UsageError, match="record format 3"):
        JobStore(tmp_path).save(JobRecord(job_id="j1", repo="/r"))  # not written over


@pytest.mark.parametrize("path", RECORDS_V1, ids=[p.stem for p in RECORDS_V1])
def test_a_job_json_of_format_1_loads_and_moves_to_the_log_at_its_next_save(
    tmp_path: Path, path: Path
) -> None:
    raw = path.read_text()
    job_id = json.loads(raw)["job_id"]
    store = JobStore(tmp_path)
    store.folder(job_id).mkdir(parents=True)
    shutil.copy(path, store.folder(job_id) / LEGACY_FILE)
    record = store.load(job_id)
    assert record.model_dump_json(indent=2) == raw
    assert [r.job_id for r in store.all()] == [job_id]
    record.diagnostics["needs_attention"] = {"state": "x"}
    store.save(record)
    assert sorted(p.name for p in store.folder(job_id).iterdir()) == [LOG_FILE]
    again = JobStore(tmp_path).load(job_id)
    assert again == record
    assert again.model_dump_json(indent=2) != raw  # the change is kept


def _append_calls(root: str, job_id: str, who: str, count: int, durable: bool) -> None:
    store = JobStore(Path(root))
    record = store.load(job_id)
    for n in range(count):
        record.tool_calls.append(call_record(n, who))
        record.diagnostics[who] = n
        store.save(record, durable=durable)


@pytest.mark.parametrize("durable", [False, True])
def test_saves_of_one_job_from_two_processes_lose_nothing(tmp_path: Path, durable: bool) -> None:
    """Two processes (as the job's own and an ``apply``) load the same record and save it
    again and again at once: every entry of both is in the log, and each field holds the
    last value saved."""
    store = JobStore(tmp_path)
    record = JobRecord(job_id="j1", repo="/r")
    add_turn(record, 0)
    store.save(record)
    ctx = multiprocessing.get_context("fork")
    count = 60 if durable else 300
    workers = [
        ctx.Process(target=_append_calls, args=(str(tmp_path), "j1", who, count, durable))
        for who in ("a", "b")
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
        assert worker.exitcode == 0
    final = JobStore(tmp_path).load("j1")
    ids = [c.id for c in final.tool_calls]
    assert len(ids) == 1 + 2 * count
    for who in ("a", "b"):
        assert [i for i in ids if i.startswith(who)] == [f"{who}c{n}" for n in range(count)]
    last = [w for w in ("a", "b") if final.diagnostics.get(w) == count - 1]
    assert last  # the field as the last save left it (as the one that saved last had it)
    assert final.transcript == record.transcript


def test_two_stores_in_one_process_lose_nothing(tmp_path: Path) -> None:
    first, second = JobStore(tmp_path), JobStore(tmp_path)
    record = JobRecord(job_id="j1", repo="/r", state="awaiting_review")
    first.save(record)
    mine, theirs = first.load("j1"), second.load("j1")
    mine.move("applied")
    first.save(mine)
    theirs.tool_calls.append(call_record(1))
    second.save(theirs)
    final = JobStore(tmp_path).load("j1")
    assert [s for s, _ in final.history] == ["applied"]
    assert final.state == "applied"  # a save writes the fields it changed: theirs did not
    assert [c.id for c in final.tool_calls] == ["c1"]


def _read_while_written(root: str, job_id: str, stop: multiprocessing.synchronize.Event) -> None:
    store = JobStore(Path(root))
    seen = 0
    while not stop.is_set() or seen == 0:
        record = store.load(job_id)
        assert len(record.tool_calls) == len(record.transcript)  # one save, never half
        assert record.diagnostics.get("turns", 0) == len(record.transcript)
        seen += 1


def test_a_reader_sees_one_save_never_half_of_the_next(tmp_path: Path) -> None:
    store = JobStore(tmp_path)
    record = JobRecord(job_id="j1", repo="/r")
    store.save(record)
    ctx = multiprocessing.get_context("fork")
    stop = ctx.Event()
    reader = ctx.Process(target=_read_while_written, args=(str(tmp_path), "j1", stop))
    reader.start()
    try:
        for n in range(1, 400):
            add_turn(record, n)
            record.diagnostics["turns"] = n
            store.save(record, durable=False)
    finally:
        stop.set()
        reader.join(60)
    assert reader.exitcode == 0


def _interrupt(root: str, job_id: str) -> None:
    store = JobStore(Path(root))
    mark_interrupted(store, store.load(job_id))


def test_an_interrupted_mark_from_another_process_keeps_the_calls(tmp_path: Path) -> None:
    store = JobStore(tmp_path)
    host = socket.gethostname()  # a controller of this host that is gone
    record = JobRecord(job_id="j1", repo="/r", controller="gone", controller_host=host)
    for state in ("preparing", "running"):
        record.move(state)
        store.save(record)
    for n in range(1, 4):
        add_turn(record, n)
        store.save(record, durable=False)
    process = multiprocessing.get_context("fork").Process(
        target=_interrupt, args=(str(tmp_path), "j1")
    )
    process.start()
    process.join(60)
    assert process.exitcode == 0
    final = JobStore(tmp_path).load("j1")
    assert final.state == "failed"
    assert final.error is not None
    assert final.error.code == "INTERRUPTED"
    assert [s for s, _ in final.history] == ["preparing", "running", "failed"]
    assert final.transcript == record.transcript
    assert final.tool_calls == record.tool_calls


def test_a_record_whose_folder_went_is_written_whole_again(tmp_path: Path) -> None:
    store = JobStore(tmp_path)
    record = JobRecord(job_id="j1", repo="/r")
    add_turn(record, 1)
    store.save(record)
    shutil.rmtree(store.folder("j1"))
    add_turn(record, 2)
    store.save(record)
    assert store.load("j1") == record


def test_a_turns_save_appends_its_lists_and_leaves_the_fields_to_the_next_save(
    tmp_path: Path,
) -> None:
    store = JobStore(tmp_path)
    record = JobRecord(job_id="j1", repo="/r")
    record.move("preparing")
    store.save(record)
    record.move("running")
    add_turn(record, 1)
    saved = store.save_turn(record)
    assert JobStore(tmp_path).load("j1").tool_calls == record.tool_calls
    assert JobStore(tmp_path).load("j1").state == "preparing"  # a turn changes lists only
    assert saved.bytes < len(record.transcript[0].model_dump_json()) + 300
    store.save(record)
    assert JobStore(tmp_path).load("j1") == record
    fresh = JobRecord(job_id="j2", repo="/r")
    add_turn(fresh, 1)
    store.save_turn(fresh)  # a record the log does not know yet is written whole
    assert JobStore(tmp_path).load("j2") == fresh


def test_a_turn_saved_by_another_thread_is_waited_for_by_a_reader_of_this_process(
    tmp_path: Path,
) -> None:
    import threading

    store = JobStore(tmp_path)
    record = JobRecord(job_id="j1", repo="/r")
    store.save(record)
    add_turn(record, 1)
    saver = store.turn_saver(record)  # made at the turn's end, run a moment later
    seen: list[int] = []
    reader = threading.Thread(target=lambda: seen.append(len(store.load("j1").tool_calls)))
    reader.start()
    reader.join(0.3)
    assert reader.is_alive()  # it waits for the save...
    saver()
    reader.join(10)
    assert seen == [1]  # ...and sees the call
    assert len(store.load("j1").transcript) == 1  # nothing left held
    # a save that raised releases its readers too
    (tmp_path / "file").write_text("not a folder")
    elsewhere = JobStore(tmp_path / "file")
    failing = elsewhere.turn_saver(record)
    with pytest.raises(OSError):
        failing()
    started = time.monotonic()
    with pytest.raises(OSError):  # not a folder of jobs: refused at once, not held
        elsewhere.load("j1")
    assert time.monotonic() - started < 5
