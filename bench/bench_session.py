"""A long session: 2,000 ``Session.call`` reads of a 16 KB file in one job, against a read of
the same file on a bare sandbox, measured in one run, interleaved.

- measured: ``controller.api.open_session(repo).call("read_file", {"path": ...})``, one job
  whose every call is a turn (the engine's loop, the tool's execution in the sandbox, the
  transcript, the ledger; the call runs on the caller's thread, and the job's record is
  saved after the turn by the job's thread while the result goes back, the next call
  waiting for that save);
- reference: ``DockerSandbox.read_file`` of the same 16 KB file (256 lines of 64 bytes) on a
  bare sandbox of the same image and runtime (the channel and the jailed read; no engine),
  one after each call, the side that goes first alternating;
- alongside the first and the last window (calls 1-100 and 1,901-2,000), in the same
  rotation, so that both windows do the same work: a fresh session's calls 1-100 (one
  session in each window: the early calls measured in the same seconds as the late ones, so
  a machine whose load changes during the run does not pass for a cost of the job's length;
  the two fresh sessions against each other show how much the machine changed), and the
  same call on a session whose per-turn saves (``JobStore.save_turn``) are skipped (a
  wrapper in this process; its state changes are saved as always): what the engine costs
  without its record.

Targets: the p50 of calls 1,901-2,000 at most 1.2x the p50 of calls 1-100 (a call must not
cost more the longer the job; given against the same session's calls 1-100 and against the
fresh session's), and at most 1.3x the reference's p50 over the same calls. The
bytes written for the job's record (what each save appends to ``log.jsonl``, summed) are
given at checkpoints next to the size of the transcript itself: written / transcript stays
flat when the record grows linearly with it.

After the 2,000 calls, the same session's calls back to back (nothing between them: each
waits for the last one's save), in blocks of ten beside blocks of ten bare reads: what a
caller that never pauses pays.

Each session's first call waits until its spare-sandbox thread is done (it fills the
baseline cache after the sandbox is ready, a few hundred ms of CPU), so calls 1-100 are not
measured against it.

    python3 bench/bench_session.py [--calls 2000] [--window 100] [--runtime runc|runsc]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from common import fmt_ms, loadavg, make_repo, percentile, print_table, sample_archive

if TYPE_CHECKING:
    from collections.abc import Callable

    from controller.api import Session

PATH = "bench/sample16.txt"
TEXT = "".join(f"{i:03d} {'x' * 59}\n" for i in range(256))
"""256 lines of 64 bytes: a 16 KB text file."""
GROWTH_TARGET = 1.2
BLOCK = 10
"""Calls in each block of back-to-back calls."""
REFERENCE_TARGET = 1.3
CHECKPOINTS = (100, 500, 1000, 1500, 2000)
TASK = {
    "prompt": "bench: read one file many times",
    "limits": {
        "memory_mb": 512,
        "workspace_mb": 64,
        "tmp_mb": 32,
        "wall_seconds": 3600,
        "max_turns": 10000,
        "max_tool_calls": 100000,
    },
}


def check(ok: bool, what: str) -> None:
    if not ok:
        raise SystemExit(f"benchmark sanity check failed: {what}")


@dataclass
class Run:
    session: list[float] = field(default_factory=list)
    bare: list[float] = field(default_factory=list)
    early: list[float] = field(default_factory=list)
    """A fresh session's calls 1-100, made alongside the long session's first window."""
    young: list[float] = field(default_factory=list)
    """Another fresh session's calls 1-100, alongside the long session's last window."""
    unsaved_early: list[float] = field(default_factory=list)
    unsaved: list[float] = field(default_factory=list)
    """Calls of a session whose per-turn saves are skipped, alongside the first window and
    (these) the last."""
    save: list[float] = field(default_factory=list)
    """Each ``JobStore.save_turn`` of the measured session's job: one per call."""
    burst: list[float] = field(default_factory=list)
    """The measured session's calls back to back, after the 2,000."""
    burst_bare: list[float] = field(default_factory=list)
    """Bare reads back to back, in blocks beside those."""
    written: list[int] = field(default_factory=list)
    """Bytes each save of the measured session's job appended."""
    points: list[tuple[int, int, int, int]] = field(default_factory=list)
    """(call, transcript bytes, record bytes written so far, size of log.jsonl)."""


class Meter:
    """Wraps the store in this process: notes each save of the measured job (how long the
    tool loop's per-turn ones take, how many bytes every one appends), and skips the
    per-turn saves of the ``unsaved`` job."""

    def __init__(self, run: Run, measured: str, unsaved: str) -> None:
        from controller.jobs.log import RecordLog
        from controller.jobs.store import JobStore

        self.run, self.measured, self.unsaved = run, measured, unsaved
        self.turn: Callable[..., Any] = JobStore.save_turn
        self.write: Callable[..., Any] = RecordLog.write

    def __enter__(self) -> Meter:
        from controller.jobs.log import RecordLog, Saved
        from controller.jobs.records import JobRecord
        from controller.jobs.store import JobStore

        turn, write, run = self.turn, self.write, self.run

        def save_turn(store: JobStore, record: JobRecord) -> Any:
            if record.job_id == self.unsaved:
                return Saved(bytes=0, entries=0)
            started = time.perf_counter()
            saved = turn(store, record)
            if record.job_id == self.measured:
                run.save.append(time.perf_counter() - started)
            return saved

        def counted(log: RecordLog[Any], folder: Path, record: JobRecord, **k: Any) -> Any:
            saved = write(log, folder, record, **k)
            if record.job_id == self.measured:
                run.written.append(saved.bytes)
            return saved

        setattr(JobStore, "save_turn", save_turn)  # noqa: B010 - this process only
        setattr(RecordLog, "write", counted)  # noqa: B010
        return self

    def __exit__(self, *_exc: object) -> None:
        from controller.jobs.log import RecordLog
        from controller.jobs.store import JobStore

        setattr(JobStore, "save_turn", self.turn)  # noqa: B010
        setattr(RecordLog, "write", self.write)  # noqa: B010


def sandbox_spec(runtime: str) -> Any:
    from controller.config.limits import Limits
    from controller.sandbox.base import SandboxSpec
    from controller.sandbox.dockerclient import connect
    from controller.sandbox.image import ImageBuilder
    from controller.sandbox.labels import new_job_id

    image = ImageBuilder(connect()).ensure().tag
    print(f"image {image}; runtime {runtime}", file=sys.stderr)
    return SandboxSpec(
        image=image,
        job_id=new_job_id(),
        runtime="runsc" if runtime == "runsc" else "runc",
        limits=Limits(memory_mb=512, workspace_mb=64, wall_seconds=3600),
    )


def settled() -> None:
    """Waits for the spare-sandbox threads sessions start (the baseline cache filled)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and any(
        t.name == "spare-offer" and t.is_alive() for t in threading.enumerate()
    ):
        time.sleep(0.05)


def timed_call(session: Session) -> float:
    started = time.perf_counter()
    result = session.call("read_file", {"path": PATH})
    elapsed = time.perf_counter() - started
    check(result.ok and (result.result or {}).get("content") == TEXT, "the call's content")
    return elapsed


def measure(args: argparse.Namespace, scratch: Path) -> Run:
    from pydantic import TypeAdapter

    from controller import api
    from controller.config.host import HostConfig
    from controller.config.task import TaskSpec
    from controller.jobs.log import LOG_FILE
    from controller.jobs.records import TranscriptTurn
    from controller.jobs.store import JobStore
    from controller.sandbox.docker import DockerSandbox
    from controller.sandbox.dockerclient import connect
    from controller.sandbox.labels import current_identity

    spec = sandbox_spec(args.runtime)
    config = HostConfig(spare_sandboxes=0, runtime=spec.runtime)
    task = TaskSpec.model_validate(TASK)
    names = ("long", "early", "young", "unsaved")
    repos = [make_repo(scratch / name, {PATH: TEXT}) for name in names]
    run = Run()
    transcript = TypeAdapter(list[TranscriptTurn])
    with (
        DockerSandbox.start(connect(), spec, current_identity()) as box,
        api.open_session(repos[0], task=task, config=config) as session,
        api.open_session(repos[1], task=task, config=config) as early,
        api.open_session(repos[2], task=task, config=config) as young,
        api.open_session(repos[3], task=task, config=config) as unsaved,
        Meter(run, session.job_id, unsaved.job_id),
    ):
        box.put_archive(sample_archive({PATH: TEXT}))
        folder = JobStore().folder(session.job_id)

        def bare() -> float:
            started = time.perf_counter()
            result = box.read_file(PATH)
            elapsed = time.perf_counter() - started
            check(result.content == TEXT, "the bare read's content")
            return elapsed

        for _ in range(args.warmup):
            bare()
        settled()
        for n in range(1, args.calls + 1):
            sides: list[tuple[list[float], Callable[[], float]]] = [
                (run.session, lambda: timed_call(session)),
                (run.bare, bare),
            ]
            # both windows rotate the same four sides: a session at its calls 1-100 (the
            # early one, then the young one) and the session without per-turn saves
            if n <= args.window:
                sides.append((run.early, lambda: timed_call(early)))
                sides.append((run.unsaved_early, lambda: timed_call(unsaved)))
            elif n > args.calls - args.window:
                sides.append((run.young, lambda: timed_call(young)))
                sides.append((run.unsaved, lambda: timed_call(unsaved)))
            for k in range(len(sides)):
                into, side = sides[(n + k) % len(sides)]
                into.append(side())
            if n in CHECKPOINTS or n == args.calls:
                size = len(transcript.dump_json(session.record.transcript))
                log = (folder / LOG_FILE).stat().st_size
                run.points.append((n, size, sum(run.written), log))
            if n % 500 == 0:
                print(f"{n} calls (load {loadavg()})", file=sys.stderr)
        check(len(session.record.tool_calls) == args.calls, "one tool call recorded per call")
        for _ in range(max(args.window // BLOCK, 1)):
            run.burst += [timed_call(session) for _ in range(BLOCK)]
            run.burst_bare += [bare() for _ in range(BLOCK)]
    return run


def tables(run: Run, args: argparse.Namespace) -> None:
    w, calls = args.window, args.calls
    first, last = slice(0, w), slice(calls - w, calls)
    span = f"{calls - w + 1:,}-{calls:,}"
    late = percentile(run.session[last], 50)
    ref = percentile(run.bare[last], 50)

    def row(
        label: str, values: list[float], ratio: float | None = None, target: float | None = None
    ) -> list[str]:
        p50, p99 = fmt_ms(percentile(values, 50)), fmt_ms(percentile(values, 99))
        shown = "-" if ratio is None else f"{ratio:.2f}x"
        if target is None or ratio is None:
            return [label, str(len(values)), p50, p99, shown, "-", "-"]
        met = "yes" if ratio <= target else "NO"
        return [label, str(len(values)), p50, p99, shown, f"<= {target:g}x", met]

    def p50(values: list[float]) -> float:
        return percentile(values, 50)

    young = p50(run.young)
    print_table(
        ["what", "n", "p50", "p99", "ratio", "target", "met?"],
        [
            row(f"Session.call, calls 1-{w}", run.session[first], 1.0),
            row(
                f"Session.call, calls {span}",
                run.session[last],
                late / p50(run.session[first]),
                GROWTH_TARGET,
            ),
            row(f"a fresh session's calls 1-{w}, alongside calls 1-{w}", run.early),
            row(f"a fresh session's calls 1-{w}, alongside calls {span}", run.young, 1.0),
            row(f"  calls {span} vs those", run.session[last], late / young, GROWTH_TARGET),
            row(
                "  the machine: those vs the first fresh session's",
                run.young,
                young / p50(run.early),
            ),
            row(f"bare read_file, alongside calls 1-{w}", run.bare[first]),
            row(f"bare read_file, alongside calls {span} (reference)", run.bare[last], 1.0),
            row(
                f"  calls {span} vs the reference", run.session[last], late / ref, REFERENCE_TARGET
            ),
            row(f"  the turn's save (the job's thread), calls 1-{w}", run.save[first]),
            row(f"  the turn's save (the job's thread), calls {span}", run.save[last]),
            row(f"no per-turn save, alongside calls 1-{w}", run.unsaved_early),
            row(f"no per-turn save, alongside calls {span}", run.unsaved, p50(run.unsaved) / ref),
            row("bare read_file back to back", run.burst_bare, 1.0),
            row(
                "  Session.call back to back (each waits for the last save)",
                run.burst,
                p50(run.burst) / p50(run.burst_bare),
            ),
        ],
    )
    print()
    rows = []
    for n, size, written, log in run.points:
        mb = (f"{size / 1e6:.2f} MB", f"{written / 1e6:.2f} MB", f"{log / 1e6:.2f} MB")
        rows.append([f"{n:,}", mb[0], mb[1], f"{written / size:.3f}", mb[2]])
    header = ["after call", "transcript", "record written", "written / transcript"]
    print_table([*header, "log.jsonl"], rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--window", type=int, default=100, help="calls in each p50 window")
    parser.add_argument("--warmup", type=int, default=100, help="bare reads before measuring")
    parser.add_argument("--runtime", choices=["runc", "runsc"], default="runc")
    args = parser.parse_args(argv)
    if args.window < 1 or args.calls < 2 * args.window:
        parser.error("--calls must be at least twice --window, which must be at least 1")
    scratch = Path(tempfile.mkdtemp(prefix="bench-session-"))
    os.environ["PATCHBOX_HOME"] = str(scratch / "home")
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    print(f"{started}; load average at the start: {loadavg()}", file=sys.stderr)
    try:
        run = measure(args, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"load average at the end: {loadavg()}", file=sys.stderr)
    tables(run, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
