"""Many jobs at once against the same number of the job's container operations, bare, at once,
measured in one run.

Each job is ``patchbox run --json`` in its own process on its own small repository, all on one
state directory: a read, a replace, one check (``python3 check.py``), then the required check
in a fresh sandbox. The reference, "the job's container operations, bare": the same number
of ``bench/bare_job.py`` processes at once, each sending the Docker API requests of one job
(``docs/performance.md``, "A job's Docker API requests") with the standard library alone: the
sweep and image lookups, then the job's two containers with the sandbox's hardening (the
controller's ``container_config``, the repository mounted read-only as the job's archive is),
the second with the check's ``docker exec``. A second, older reference: as many
``docker run --rm --network none IMAGE true`` at once. The three batches of a round run one
after the other (their order turns each round). Reported: wall time of each batch, the
jobs' ratio to each reference, job latency p50/p99, failures (a job that did not end
``awaiting_review`` with JSON on stdout, or a reference process that did not exit 0), and
where the CPU went: the daemon's processes (``common.DaemonCpu``: dockerd and containerd,
the shims with runc and the containers' processes, fuse-overlayfs), the client processes'
own CPU (rusage: the ``patchbox`` processes, or the bare ones) and the machine's busy CPU
seconds (``/proc/stat``). The last lines are the medians over the rounds.

    python3 bench/bench_concurrency.py [--jobs 20 50] [--rounds 3] [--spares 1]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import docker
from docker.models.containers import _create_container_args  # type: ignore[attr-defined]

from common import (
    DAEMON_GROUPS,
    DaemonCpu,
    loadavg,
    make_repo,
    percentile,
    print_table,
    remove_labelled,
    sample_archive,
    wait_spares_started,
)
from controller.config.limits import Limits
from controller.identity import CONTROLLER, JOB, KIND, OWNER, OWNER_VALUE
from controller.sandbox.base import SandboxSpec
from controller.sandbox.docker import container_config
from controller.sandbox.dockerclient import connect
from controller.sandbox.image import DEFAULT_BASE, ImageBuilder, ImageInfo
from controller.sandbox.labels import OWNER_FILTER

if TYPE_CHECKING:
    from collections.abc import Callable

ROOT = Path(__file__).resolve().parent.parent
APP = 'def greet(name):\n    return "hello " + name\n'
CHECK = "import sys\nfrom app import greet\nsys.exit(0 if greet('x') == 'Hello x' else 1)\n"
CHECK_ARGV = ["python3", "check.py"]
CHECK_TIMEOUT = 120
LIMITS = {"memory_mb": 256, "workspace_mb": 32, "tmp_mb": 16, "wall_seconds": 600}
TASK = {
    "prompt": "Capitalize the greeting.",
    "checks": {"greet": {"argv": CHECK_ARGV, "timeout_seconds": CHECK_TIMEOUT}},
    "limits": LIMITS,
}
EDITED = APP.replace('"hello "', '"Hello "')
RECEIVER = (
    "import os,sys,tarfile\n"
    "tarfile.open(os.environ['PATCHBOX_PRELOAD']).extractall('/workspace')\n"
    "sys.stdout.write('ready\\n');sys.stdout.flush()\n"
    "sys.stdin.buffer.read()\n"
)
"""What the reference's containers run (the image's python3, as the agent): unpack the
mounted repository into the tmpfs workspace, say so, wait for stdin's end."""
BARE_JOB = ROOT / "bench" / "bare_job.py"
CALLS = {
    "turns": [
        [{"id": "c1", "name": "read_file", "arguments": {"path": "app.py"}}],
        [
            {
                "id": "c2",
                "name": "replace_text",
                "arguments": {"path": "app.py", "oldText": '"hello "', "newText": '"Hello "'},
            }
        ],
        [{"id": "c3", "name": "run_check", "arguments": {"checkId": "greet"}}],
    ],
    "final": "done",
}


def greet_repo(root: Path, n: int) -> Path:
    """Repository ``n`` of the greeting project (its README names it)."""
    files = {"app.py": APP, "check.py": CHECK, "README.md": f"# repository {n}\n"}
    return make_repo(root, files, "greet")


def busy_seconds() -> float:
    """CPU seconds the whole machine has spent busy since boot (all but idle and iowait)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def ops_plan(client: docker.DockerClient, info: ImageInfo, folder: Path, run_id: str) -> Path:
    """The plan ``bench/bare_job.py`` follows: the job's two create bodies, built as the job
    builds them (``container_config``, then docker-py's own request body), with this run's
    labels and the repository (before and after the edit) as a read-only mounted archive."""
    folder.mkdir(parents=True, exist_ok=True)
    labels = {OWNER: OWNER_VALUE, KIND: "bench", JOB: run_id}
    limits = Limits.model_validate(LIMITS)
    bodies = {}
    for name, app in (("sandbox", APP), ("check", EDITED)):
        archive = folder / f"{name}.tar"
        archive.write_bytes(sample_archive({"app.py": app, "check.py": CHECK}))
        archive.chmod(0o644)
        spec = SandboxSpec(
            image=info.tag,
            limits=limits,
            job_id=run_id,
            agent_argv=("python3", "-I", "-S", "-B", "-c", RECEIVER),
            preload=str(archive),
        )
        config = dict(container_config(spec, labels))
        args = _create_container_args({**config, "version": client.api.api_version})
        args.pop("name", None)
        args.pop("platform", None)
        bodies[name] = dict(client.api.create_container_config(**args))
    plan = {
        "sweep_label": OWNER_FILTER,
        "images": [DEFAULT_BASE, info.base, info.tag],
        **bodies,
        "check_argv": ["timeout", "-s", "KILL", str(CHECK_TIMEOUT), *CHECK_ARGV],
    }
    path = folder / "plan.json"
    path.write_text(json.dumps(plan))
    return path


def batch_ops(plan: Path, n: int) -> tuple[float, int]:
    """``n`` bare jobs' container operations at once, each from its own process (the
    standard library alone); returns the wall time and how many did not exit 0."""
    argv = [sys.executable, "-I", "-S", str(BARE_JOB), str(plan)]
    started = time.monotonic()
    procs = [subprocess.Popen(argv, stderr=subprocess.PIPE, text=True) for _ in range(n)]
    failures = 0
    for proc in procs:
        _, err = proc.communicate()
        if proc.returncode != 0:
            failures += 1
            print(f"bare job failed (exit {proc.returncode}): {err[-500:]}", file=sys.stderr)
    return time.monotonic() - started, failures


def batch_jobs(work: Path, n: int, home: Path) -> tuple[float, list[float], int]:
    """Starts ``n`` jobs at once; returns the wall time, each job's latency, failures."""
    inputs = work / "inputs"
    repos = [greet_repo(work / f"repo{i}", i) for i in range(n)]
    env = {**os.environ, "PATCHBOX_HOME": str(home)}
    argv = [sys.executable, "-m", "controller", "run", "--json"]
    argv += ["--task", str(inputs / "task.json"), "--calls", str(inputs / "calls.json")]
    argv += ["--config", str(inputs / "config.toml")]
    started = time.monotonic()
    procs = [
        (
            time.monotonic(),
            subprocess.Popen(
                [*argv, "--repo", str(repo)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                cwd=ROOT,
                env=env,
            ),
        )
        for repo in repos
    ]
    latencies, failures = [], 0
    pending = dict(enumerate(procs))
    while pending:
        for key, (t0, proc) in list(pending.items()):
            if proc.poll() is None:
                continue
            latencies.append(time.monotonic() - t0)
            out, err = proc.communicate()
            try:
                ok = json.loads(out)["status"] == "awaiting_review"
            except (ValueError, KeyError, TypeError):
                ok = False
            if not ok:
                failures += 1
                print(f"job failed (exit {proc.returncode}): {err[-500:]}", file=sys.stderr)
            del pending[key]
        time.sleep(0.02)
    return time.monotonic() - started, latencies, failures


def batch_bare(image: str, n: int, label: str | None = None) -> float:
    argv = ["docker", "run", "--rm", "--network", "none"]
    argv += ["--label", label] if label else []
    argv += [image, "true"]
    started = time.monotonic()
    procs = [subprocess.Popen(argv, stdout=subprocess.DEVNULL) for _ in range(n)]
    for proc in procs:
        proc.wait()
    return time.monotonic() - started


def cpu_cells(daemon: DaemonCpu, client_cpu: float, busy: float) -> list[str]:
    """The daemon's groups, their sum, the client processes' own CPU, the machine's busy."""
    cells = [f"{daemon.seconds[g]:.1f}" for g in DAEMON_GROUPS]
    return [
        *cells,
        f"{daemon.total:.1f}",
        f"{client_cpu:.1f}",
        f"{busy:.0f}",
        f"{daemon.others:.1f}",
    ]


def median_row(rows: list[list[str]], label: list[str]) -> list[str]:
    """The medians of the numeric cells of ``rows`` (from the first unit-bearing cell on)."""
    out = list(label)
    for col in range(len(label), len(rows[0])):
        values = [float(r[col].split()[0].rstrip("x")) for r in rows]
        token = rows[0][col].split()[0]
        unit = "x" if token.endswith("x") else rows[0][col][len(token) :]
        mid = percentile(values, 50)
        out.append(f"{mid:.2f}{unit}" if unit.startswith("x") else f"{mid:.1f}{unit}")
    return out


def ours(run_id: str) -> Callable[[dict[str, str]], bool]:
    """Whether a container is this bench's: labelled with its run id (the bare sides), or
    made by a controller process that is this process's child (the jobs, the service)."""
    me = str(os.getpid())

    def test(labels: dict[str, str]) -> bool:
        if labels.get(JOB, "").startswith(run_id):
            return True
        parts = labels.get(CONTROLLER, "").split(":")
        if len(parts) != 4 or not parts[1].isdigit():
            return False
        try:
            stat = Path(f"/proc/{parts[1]}/stat").read_text(encoding="ascii", errors="replace")
        except OSError:
            return False
        return stat.rsplit(")", 1)[1].split()[1] == me

    return test


class Side:
    """One batch's measures: wall time, its CPU, and what the jobs' side adds."""

    def __init__(self, root: str, run_id: str) -> None:
        self.daemon = DaemonCpu(root, mine=ours(run_id))
        self.wall = 0.0
        self.client = 0.0
        self.busy = 0.0
        self.failures = 0

    def __enter__(self) -> Side:
        self._busy0, self._own0 = busy_seconds(), children_cpu()
        self.daemon.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.daemon.__exit__(*exc)
        self.busy = busy_seconds() - self._busy0
        self.client = children_cpu() - self._own0


def one_round(
    plan: Path, n: int, rnd: int, args: argparse.Namespace
) -> tuple[list[str], list[list[str]]]:
    """One round of ``n``: the bare operations and the jobs (in turn first), then the bare
    ``docker run`` (``args``: ``spares``, ``image``, ``root``); the wall-time row and the CPU
    rows."""
    root = args.root
    with tempfile.TemporaryDirectory(prefix="bench-conc-") as tmp:
        work = Path(tmp)
        (work / "inputs").mkdir()
        (work / "inputs" / "task.json").write_text(json.dumps(TASK))
        (work / "inputs" / "calls.json").write_text(json.dumps(CALLS))
        (work / "inputs" / "config.toml").write_text(
            f"spare_sandboxes = {args.spares}\nspare_idle_seconds = 30\n"
        )
        ops, jobs, bare = (Side(root, args.run_id) for _ in range(3))
        lat: list[float] = []
        for step in ("ops", "jobs") if rnd % 2 == 0 else ("jobs", "ops"):
            if step == "ops":
                with ops:
                    ops.wall, ops.failures = batch_ops(plan, n)
            else:
                with jobs:
                    jobs.wall, lat, jobs.failures = batch_jobs(work, n, work / "home")
                    wait_spares_started(work / "home")  # untimed; its CPU is the jobs'

        with bare:
            bare.wall = batch_bare(args.image, n, label=f"{JOB}={args.run_id}-true")
    wall_row = [
        str(n),
        str(rnd + 1),
        f"{ops.wall:.1f} s",
        f"{bare.wall:.1f} s",
        f"{jobs.wall:.1f} s",
        f"{jobs.wall / ops.wall:.2f}x",
        f"{jobs.wall / bare.wall:.2f}x",
        f"{percentile(lat, 50):.1f} s",
        f"{percentile(lat, 99):.1f} s",
        f"{jobs.failures} / {ops.failures}",
    ]
    cpu_rows = [
        [str(n), str(rnd + 1), what, *cpu_cells(side.daemon, side.client, side.busy)]
        for what, side in (("ops, bare", ops), ("jobs", jobs), ("run true", bare))
    ]
    return wall_row, cpu_rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, nargs="+", default=[20, 50])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--spares", type=int, default=1, help="spare_sandboxes for the jobs")
    args = parser.parse_args()
    client = connect()
    info = ImageBuilder(client, lambda m: print(m, file=sys.stderr)).ensure()
    args.image = info.tag
    args.root = str(client.info().get("DockerRootDir", "/var/lib/docker"))
    run_id = args.run_id = f"bench-ops-{os.getpid()}-{int(time.time())}"
    walls, cpus = [], []
    print(f"load before: {loadavg()}")
    with tempfile.TemporaryDirectory(prefix="bench-ops-") as plan_dir:
        plan = ops_plan(client, info, Path(plan_dir), run_id)
        try:
            for n in args.jobs:
                n_walls, n_cpus = [], []
                for rnd in range(args.rounds):
                    wall_row, cpu_rows = one_round(plan, n, rnd, args)
                    n_walls.append(wall_row)
                    n_cpus += cpu_rows
                walls += [
                    *n_walls,
                    [*median_row([r[:9] for r in n_walls], [str(n), "median"]), "-"],
                ]
                cpus += n_cpus
                for what in ("ops, bare", "jobs", "run true"):
                    mine = [r for r in n_cpus if r[2] == what]
                    cpus.append(median_row(mine, [str(n), "median", what]))
        finally:
            remove_labelled(client, f"{JOB}={run_id}")
    header = ["jobs", "round", "ops, bare", "run true", "jobs wall", "ratio ops"]
    header += ["ratio true", "p50", "p99", "failures jobs / ops"]
    print_table(header, walls)
    print()
    header = ["jobs", "round", "side", *DAEMON_GROUPS, "daemon side", "client", "machine busy"]
    header.append("others' containers")
    print("CPU seconds over each batch")
    print_table(header, cpus)
    print(f"load after: {loadavg()}")


if __name__ == "__main__":
    main()
