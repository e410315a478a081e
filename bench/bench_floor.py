"""The limits: a tool call against the channel's own floor, a one-call job against a bare
container run, both measured in one run, interleaved.

1. The transport floor. The agent has no echo or ping operation; the cheapest one that
   exists is ``cancel`` of a call that is not running (``{"target": 0}``): a request frame
   over the attach stream, the agent's decode and dispatch, a signed answer
   (``{"cancelled": false}``), the controller's check of the signature and strict decode.
   Against it, in rotating order on the same sandbox: ``read_file`` of a 1 KB file
   (``DockerSandbox.read_file``: the same round trip plus the jailed read and the result's
   validation), and for context the same read as a tool call through
   ``controller.api.Session.call`` (a whole turn of the engine) on a session of its own.
   Target: p50(read_file) at most 2x p50(floor).
2. A one-call job through the CLI: ``python3 -m controller run --calls`` with a calls file
   holding one ``read_file`` and a task without checks (the job ends ``no_change``, exit
   code 5), against ``docker run --rm --network none --entrypoint
   true IMAGE`` of the sandbox image, two ways: with the default configuration (one spare:
   the job claims the spare the previous round left and offers one for the next) and with
   spares off (``spare_sandboxes = 0``: the job starts its own container). Target:
   median(job) at most 2x median(docker run). In the same rounds, both jobs are run once
   more in a CLI process that timestamps their phases (the bench's own wrappers around the
   functions the job calls; the controller is not changed), and the interpreter and import
   times are taken on their own: ``python3 -c pass``, ``python3 -c 'import
   controller.cli.main, controller.cli.commands'`` (what ``run`` imports before it does
   anything), ``python3 -c 'import pydantic, docker, structlog'`` (the dependencies alone)
   and ``python3 -m controller --version``. After each side, untimed, the bench waits until
   no spare of its state directory is still being started (a job ends once the daemon has
   its spare's start; the rest of that start must not fall into the next side's time).

   The controller's modules are compiled to bytecode first (``compileall``), as installing
   the package does; ``--no-compile`` removes that bytecode and sets
   ``PYTHONDONTWRITEBYTECODE=1``: every start then compiles the controller's sources, as in
   a checkout on a machine that never writes bytecode.

    python3 bench/bench_floor.py [--part floor|job|both] [--calls 2000] [--api-calls 200]
                                 [--jobs 10] [--no-compile]
"""

from __future__ import annotations

import argparse
import compileall
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from common import (
    SAMPLE,
    SAMPLE_PATH,
    fmt_ms,
    loadavg,
    make_repo,
    percentile,
    print_table,
    remove_labelled,
    sample_archive,
    wait_spares_started,
)

if TYPE_CHECKING:
    from collections.abc import Callable

ROOT = Path(__file__).resolve().parent.parent
AGENT = ROOT / "sandbox-image" / "patchbox_agent"
FLOOR_TARGET = 2.0
JOB_TARGET = 2.0
EVENTS_ENV = "BENCH_FLOOR_EVENTS"
TASK = {"prompt": "read one file"}
CALLS = {
    "turns": [[{"id": "c1", "name": "read_file", "arguments": {"path": "bench/sample.txt"}}]],
    "final": "done",
}
DEPENDENCIES = "import pydantic, docker, structlog"
"""The third-party packages a job needs, imported alone: part of any CLI job's floor."""


def check(ok: bool, what: str) -> None:
    if not ok:
        raise SystemExit(f"benchmark sanity check failed: {what}")


# -- 1. the floor -----------------------------------------------------------------------


def measure_floor(args: argparse.Namespace, scratch: Path) -> dict[str, list[float]]:
    from controller import api
    from controller.config.host import HostConfig
    from controller.config.limits import Limits
    from controller.config.task import TaskSpec
    from controller.jobs.store import JobStore
    from controller.sandbox.base import SandboxSpec
    from controller.sandbox.docker import DockerSandbox
    from controller.sandbox.dockerclient import connect
    from controller.sandbox.image import ImageBuilder
    from controller.sandbox.labels import current_identity, new_job_id
    from controller.tools.executor import ToolExecutor

    client = connect()
    image = ImageBuilder(client).ensure().tag
    spec = SandboxSpec(
        image=image,
        job_id=new_job_id(),
        runtime="runc",
        limits=Limits(memory_mb=512, workspace_mb=128, wall_seconds=3600),
    )
    task = TaskSpec.model_validate(
        {
            "prompt": "bench",
            "limits": {"wall_seconds": 3600, "max_turns": 10000, "max_tool_calls": 100000},
        }
    )
    repo = make_repo(scratch / "floor-repo")
    series: dict[str, list[float]] = {k: [] for k in ("floor", "read", "api", "execute", "save")}
    with (
        DockerSandbox.start(client, spec, current_identity()) as box,
        api.open_session(repo, task=task, config=HostConfig(spare_sandboxes=0)) as session,
    ):
        box.put_archive(sample_archive())
        agent = box.session

        def floor() -> float:
            started = time.perf_counter()
            result = agent.call("cancel", {"target": 0}, 10.0)
            elapsed = time.perf_counter() - started
            check(result == {"cancelled": False}, "cancel of nothing")
            return elapsed

        def read() -> float:
            started = time.perf_counter()
            result = box.read_file(SAMPLE_PATH)
            elapsed = time.perf_counter() - started
            check(result.content == SAMPLE, "read_file's content")
            return elapsed

        def over_api() -> float:
            started = time.perf_counter()
            result = session.call("read_file", {"path": SAMPLE_PATH})
            elapsed = time.perf_counter() - started
            check(result.ok and (result.result or {}).get("content") == SAMPLE, "api read")
            return elapsed

        for _ in range(args.warmup):
            floor()
            read()
        for _ in range(args.warmup // 10):
            over_api()
        time_calls(ToolExecutor, "execute", series["execute"])
        time_calls(JobStore, "save_turn", series["save"])
        rounds = max(args.api_calls, 1)
        per_round = max(args.calls // rounds, 1)
        sides: list[tuple[str, Callable[[], float], int]] = [
            ("floor", floor, per_round),
            ("read", read, per_round),
            ("api", over_api, 1),
        ]
        for r in range(rounds):
            for k in range(len(sides)):
                name, fn, n = sides[(r + k) % len(sides)]
                series[name] += [fn() for _ in range(n)]
    return series


def floor_rows(series: dict[str, list[float]]) -> list[list[str]]:
    p50 = {k: percentile(v, 50) for k, v in series.items()}
    ratio_read = p50["read"] / p50["floor"]
    met = "yes" if ratio_read <= FLOOR_TARGET else "NO"
    labels = {
        "floor": ("floor: cancel of nothing over attach", "1", "-", "-"),
        "read": (
            "read_file over attach (DockerSandbox)",
            f"{ratio_read:.2f}x",
            f"<= {FLOOR_TARGET:.0f}x",
            met,
        ),
        "api": (
            "read_file through api.Session.call",
            f"{p50['api'] / p50['floor']:.2f}x",
            "-",
            "-",
        ),
        "execute": (
            "  of which the tool's execution",
            f"{p50['execute'] / p50['floor']:.2f}x",
            "-",
            "-",
        ),
        "save": (
            "  of which the job record saved",
            f"{p50['save'] / p50['floor']:.2f}x",
            "-",
            "-",
        ),
    }
    rows: list[list[str]] = []
    for key, (label, ratio, target, ok) in labels.items():
        values = series[key]
        p99 = fmt_ms(percentile(values, 99))
        rows.append([label, str(len(values)), fmt_ms(p50[key]), p99, ratio, target, ok])
    return rows


def time_calls(owner: type, name: str, into: list[float]) -> None:
    """Wraps ``owner.name`` (in this process only) to note how long each call takes."""
    original: Callable[..., Any] = getattr(owner, name)

    def wrapped(*a: Any, **k: Any) -> Any:
        started = time.perf_counter()
        try:
            return original(*a, **k)
        finally:
            into.append(time.perf_counter() - started)

    setattr(owner, name, wrapped)


# -- 2. the job: the traced CLI process ---------------------------------------------------


def trace_cli(argv: list[str]) -> int:
    """``python3 -m controller`` with timestamps around the job's phases, written as JSON to
    the file ``$BENCH_FLOOR_EVENTS`` names; runs in a process of its own."""
    events: list[tuple[str, float]] = [("child", time.time())]
    gc.disable()  # as ``patchbox``'s entry point does; the CLI's run turns it back on
    import controller.main

    controller.main.import_logging()  # as the entry point does
    import controller.cli.commands
    import controller.cli.main as cli

    events.append(("imported", time.time()))
    from controller.jobs import engine
    from controller.sandbox import prepare
    from controller.sandbox.docker import DockerSandbox
    from controller.sandbox.image import ImageBuilder

    def wrap(owner: object, name: str, label: str, *, static: bool = False) -> None:
        original: Callable[..., Any] = getattr(owner, name)

        def wrapped(*a: Any, **k: Any) -> Any:
            events.append((f"{label}>", time.time()))
            try:
                return original(*a, **k)
            finally:
                events.append((f"{label}<", time.time()))

        setattr(owner, name, staticmethod(wrapped) if static else wrapped)

    wrap(cli, "settle_leftovers", "settle")
    wrap(controller.cli.commands, "cmd_run", "cmd_run")
    wrap(engine.Job, "run", "job")
    wrap(ImageBuilder, "ensure", "image")
    wrap(engine, "prepare", "prepare")
    wrap(prepare, "build_baseline", "baseline")
    wrap(DockerSandbox, "start", "start", static=True)
    wrap(engine, "collect", "collect")
    wrap(DockerSandbox, "close", "close")
    wrap(engine, "write_evidence", "evidence")
    wrap(prepare.Prepared, "finish", "offer")
    main = cli.main

    def traced_main(_: Any = None, doors: Any = None) -> int:
        try:
            return main(argv, doors)
        finally:
            events.append(("main<", time.time()))
            Path(os.environ[EVENTS_ENV]).write_text(json.dumps(events))

    cli.main = traced_main  # type: ignore[assignment]
    events.append(("wrapped", time.time()))
    cli.run()  # the command's own entry point, and its way of ending the process
    return 0


PHASES: list[tuple[str, str, str]] = [
    ("interpreter start", "spawn", "child"),
    ("imports of controller.cli.main and .commands", "child", "imported"),
    ("imports the job makes later (engine, docker-py)", "imported", "wrapped"),
    ("logging set-up, parsing", "wrapped", "settle>"),
    ("settle (reaper, job records)", "settle>", "settle<"),
    ("config, task, calls, docker connect, make_job", "settle<", "job>"),
    ("job: record, lock, checks, image ensure", "job>", "prepare>"),
    ("  of which image ensure", "image>", "image<"),
    ("prepare: health gate + baseline", "baseline>", "baseline<"),
    ("prepare: container create, start, hello", "start>", "start<"),
    ("prepare: rest (archive into the sandbox)", "start<", "prepare<"),
    ("loop: the one read_file", "prepare<", "collect>"),
    ("collection (changes from the sandbox)", "collect>", "collect<"),
    ("teardown (sandbox removal, on a thread of its own)", "close>", "close<"),
    ("validation, decision, waits for the removal and spare", "collect<", "evidence>"),
    ("  of which waiting for the removal and the spare offer", "offer>", "offer<"),
    ("evidence", "evidence>", "evidence<"),
    ("record saved", "evidence<", "job<"),
    ("output (job view, summary)", "job<", "main<"),
    ("interpreter exit", "main<", "exit"),
]


def phases_of(events: list[tuple[str, float]]) -> dict[str, float]:
    """Seconds per phase of one traced run (first occurrence of each mark)."""
    marks: dict[str, float] = {}
    collected = False
    for name, at in events:
        collected = collected or name == "collect<"
        if name.startswith("close") and not collected:
            continue  # a close before the collection's end is not the teardown
        marks.setdefault(name, at)
    return {
        label: marks[end] - marks[begin]
        for label, begin, end in PHASES
        if begin in marks and end in marks
    }


@dataclass
class JobSamples:
    job: list[float] = field(default_factory=list)
    job_cold: list[float] = field(default_factory=list)
    traced: list[float] = field(default_factory=list)
    traced_cold: list[float] = field(default_factory=list)
    docker_run: list[float] = field(default_factory=list)
    python_pass: list[float] = field(default_factory=list)
    imports: list[float] = field(default_factory=list)
    deps: list[float] = field(default_factory=list)
    version: list[float] = field(default_factory=list)
    phases: dict[str, list[float]] = field(default_factory=dict)
    phases_cold: dict[str, list[float]] = field(default_factory=dict)


def timed(argv: list[str], env: dict[str, str], ok: Callable[[int], bool]) -> float:
    started = time.perf_counter()
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, check=False)
    elapsed = time.perf_counter() - started
    if not ok(proc.returncode):
        err = proc.stderr.decode(errors="replace")[-2000:]
        raise SystemExit(f"{argv[:4]} ended {proc.returncode}: {err}")
    return elapsed


class JobBench:
    """The job's rounds: each side a subprocess, timed from the outside."""

    def __init__(self, scratch: Path, image: str, repo: Path) -> None:
        (scratch / "task.json").write_text(json.dumps(TASK))
        (scratch / "calls.json").write_text(json.dumps(CALLS))
        # one spare (the default), kept long enough for the rounds whatever their pace
        (scratch / "config.toml").write_text("spare_sandboxes = 1\nspare_idle_seconds = 600\n")
        (scratch / "cold.toml").write_text("spare_sandboxes = 0\n")
        self.files = ["--repo", str(repo), "--task", str(scratch / "task.json")]
        self.files += ["--calls", str(scratch / "calls.json"), "--config"]
        self.config = str(scratch / "config.toml")
        self.cold = str(scratch / "cold.toml")
        self.image = image
        self.events_file = scratch / "events.json"
        self.env = dict(os.environ)
        self.env[EVENTS_ENV] = str(self.events_file)
        self.samples = JobSamples()
        self.py = sys.executable

    @staticmethod
    def _one_call_job(code: int) -> bool:
        return code == 5  # NO_CHANGE: a job that only reads makes no change

    @staticmethod
    def _zero(code: int) -> bool:
        return code == 0

    def job(self) -> None:
        argv = [self.py, "-m", "controller", "run", *self.files, self.config, "--json"]
        self.samples.job.append(timed(argv, self.env, self._one_call_job))

    def job_cold(self) -> None:
        argv = [self.py, "-m", "controller", "run", *self.files, self.cold, "--json"]
        self.samples.job_cold.append(timed(argv, self.env, self._one_call_job))

    def _traced(self, config: str, into: list[float], phases: dict[str, list[float]]) -> None:
        me = str(Path(__file__).resolve())
        argv = [self.py, me, "trace-cli", "run", *self.files, config, "--json"]
        spawn = time.time()
        into.append(timed(argv, self.env, self._one_call_job))
        ended = time.time()
        marks = json.loads(self.events_file.read_text())
        events = [("spawn", spawn), *((str(n), float(t)) for n, t in marks), ("exit", ended)]
        for label, seconds in phases_of(events).items():
            phases.setdefault(label, []).append(seconds)

    def traced(self) -> None:
        self._traced(self.config, self.samples.traced, self.samples.phases)

    def traced_cold(self) -> None:
        self._traced(self.cold, self.samples.traced_cold, self.samples.phases_cold)

    def docker_run(self) -> None:
        argv = ["docker", "run", "--rm", "--network=none", "--entrypoint=true", self.image]
        self.samples.docker_run.append(timed(argv, self.env, self._zero))

    def interpreters(self) -> None:
        s = self.samples
        s.python_pass.append(timed([self.py, "-c", "pass"], self.env, self._zero))
        imports = "import controller.cli.main, controller.cli.commands"
        s.imports.append(timed([self.py, "-c", imports], self.env, self._zero))
        s.deps.append(timed([self.py, "-c", DEPENDENCIES], self.env, self._zero))
        version = [self.py, "-m", "controller", "--version"]
        s.version.append(timed(version, self.env, self._zero))


def measure_job(args: argparse.Namespace, scratch: Path) -> tuple[JobSamples, str]:
    from controller.sandbox.dockerclient import connect
    from controller.sandbox.image import ImageBuilder

    image = ImageBuilder(connect()).ensure().tag
    bench = JobBench(scratch, image, make_repo(scratch / "job-repo"))
    sides: list[Callable[[], None]] = [
        bench.job,
        bench.docker_run,
        bench.job_cold,
        bench.traced,
        bench.traced_cold,
        bench.interpreters,
    ]
    for _ in range(args.job_warmup):
        for side in sides:
            side()
            wait_spares_started()
    bench.samples = JobSamples()
    for r in range(args.jobs):
        for k in range(len(sides)):
            sides[(r + k) % len(sides)]()
            wait_spares_started()
        print(f"job round {r + 1}/{args.jobs} (load {loadavg()})", file=sys.stderr)
    return bench.samples, image


def job_rows(s: JobSamples) -> tuple[list[list[str]], list[list[str]]]:
    def ms(values: list[float]) -> str:
        return f"{percentile(values, 50) * 1000:.0f} ms"

    ref = percentile(s.docker_run, 50)
    rows: list[list[str]] = []
    for label, values in (
        ("one-call job: python3 -m controller run", s.job),
        ("the same, spares off (its own container)", s.job_cold),
        ("the first, traced (phases below)", s.traced),
        ("the second, traced (phases below)", s.traced_cold),
        ("docker run --rm --network none IMAGE true (reference)", s.docker_run),
        ("python3 -c pass", s.python_pass),
        ("python3 -c 'import controller.cli.main, .commands'", s.imports),
        ("python3 -c 'import pydantic, docker, structlog'", s.deps),
        ("python3 -m controller --version", s.version),
    ):
        rows.append([label, str(len(values)), ms(values)])
        rows[-1] += [f"{percentile(values, 50) / ref:.2f}x", "-", "-"]
    for row, values in ((rows[0], s.job), (rows[1], s.job_cold)):
        met = "yes" if percentile(values, 50) / ref <= JOB_TARGET else "NO"
        row[4:] = [f"<= {JOB_TARGET:.0f}x", met]
    phase_rows = [
        [label, ms(s.phases.get(label, [0.0])), ms(s.phases_cold.get(label, [0.0]))]
        for label, _, _ in PHASES
        if label in s.phases or label in s.phases_cold
    ]
    return rows, phase_rows


def remove_spares() -> None:
    """The spares this run's jobs offered (its own state directory's): removed, not left to
    end by themselves."""
    from controller.sandbox.dockerclient import connect
    from controller.sandbox.labels import HOME, home_id

    remove_labelled(connect(), f"{HOME}={home_id()}")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["trace-cli"]:
        return trace_cli(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--part", choices=["floor", "job", "both"], default="both")
    parser.add_argument("--calls", type=int, default=2000, help="floor and read calls each")
    parser.add_argument("--api-calls", type=int, default=200, help="reads through the API")
    parser.add_argument("--warmup", type=int, default=200, help="calls before measuring")
    parser.add_argument("--jobs", type=int, default=10, help="measured job rounds")
    parser.add_argument("--job-warmup", type=int, default=1, help="job rounds before measuring")
    parser.add_argument(
        "--no-compile",
        action="store_true",
        help="leave the controller's bytecode as it is (none, under PYTHONDONTWRITEBYTECODE=1)",
    )
    args = parser.parse_args(argv)
    if min(args.calls, args.api_calls, args.jobs) < 1:
        parser.error("--calls, --api-calls and --jobs must be at least 1")
    scratch = Path(tempfile.mkdtemp(prefix="bench-floor-"))
    os.environ["PATCHBOX_HOME"] = str(scratch / "home")
    print(
        f"{time.strftime('%Y-%m-%d %H:%M:%S')}; load average at the start: {loadavg()}",
        file=sys.stderr,
    )
    if args.no_compile:
        for cache in [*(ROOT / "controller").rglob("__pycache__"), *AGENT.rglob("__pycache__")]:
            shutil.rmtree(cache)
        os.environ["PYTHONDONTWRITEBYTECODE"] = "1"
        print("bytecode: none; every start compiles the controller's modules")
    else:
        for package in (ROOT / "controller", AGENT):
            compileall.compile_dir(package, quiet=1)
        print("bytecode: the controller's modules compiled ahead, as installing does")
    try:
        if args.part in {"floor", "both"}:
            rows = floor_rows(measure_floor(args, scratch))
            print(f"floor done (load {loadavg()})", file=sys.stderr)
            print_table(["what", "n", "p50", "p99", "ratio vs floor", "target", "met?"], rows)
            print()
        if args.part in {"job", "both"}:
            samples, image = measure_job(args, scratch)
            rows, phase_rows = job_rows(samples)
            print(f"image {image}", file=sys.stderr)
            print_table(["what", "n", "median", "ratio vs docker run", "target", "met?"], rows)
            print()
            header = ["phase of the traced jobs (medians)", "one spare", "spares off"]
            print_table(header, phase_rows)
    finally:
        remove_spares()
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"load average at the end: {loadavg()}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
