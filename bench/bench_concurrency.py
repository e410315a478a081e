"""Many jobs at once against as many bare container runs at once, measured in one run.

Each job is ``patchbox run --json`` in its own process on its own small repository, all on one
state directory: a read, a replace, one check (``python3 check.py``). The reference is the
same number of concurrent ``docker run --rm --network none IMAGE true``. Reported: wall time
of the whole batch, its ratio to the reference, job latency p50/p99, failures (a job that
did not end ``awaiting_review`` with JSON on stdout), and where the CPU went: the machine's
busy CPU seconds during the batch (``/proc/stat``), of which the ``patchbox`` processes
themselves used (their rusage); the rest is the daemon, containerd, runc, fuse-overlayfs and
the containers.

    python3 bench/bench_concurrency.py [--jobs 20 50] [--rounds 1] [--spares 1]
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

from common import loadavg, make_repo, percentile, print_table
from controller.sandbox.dockerclient import connect
from controller.sandbox.image import ImageBuilder

ROOT = Path(__file__).resolve().parent.parent
APP = 'def greet(name):\n    return "hello " + name\n'
CHECK = "import sys\nfrom app import greet\nsys.exit(0 if greet('x') == 'Hello x' else 1)\n"
TASK = {
    "prompt": "Capitalize the greeting.",
    "checks": {"greet": {"argv": ["python3", "check.py"], "timeout_seconds": 120}},
    "limits": {"memory_mb": 256, "workspace_mb": 32, "tmp_mb": 16, "wall_seconds": 600},
}
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


def batch_bare(image: str, n: int) -> float:
    argv = ["docker", "run", "--rm", "--network", "none", image, "true"]
    started = time.monotonic()
    procs = [subprocess.Popen(argv, stdout=subprocess.DEVNULL) for _ in range(n)]
    for proc in procs:
        proc.wait()
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, nargs="+", default=[20, 50])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--spares", type=int, default=1, help="spare_sandboxes for the jobs")
    args = parser.parse_args()
    client = connect()
    image = ImageBuilder(client, lambda m: print(m, file=sys.stderr)).ensure().tag
    rows = []
    print(f"load before: {loadavg()}")
    for n in args.jobs:
        for rnd in range(args.rounds):
            with tempfile.TemporaryDirectory(prefix="bench-conc-") as tmp:
                work = Path(tmp)
                (work / "inputs").mkdir()
                (work / "inputs" / "task.json").write_text(json.dumps(TASK))
                (work / "inputs" / "calls.json").write_text(json.dumps(CALLS))
                (work / "inputs" / "config.toml").write_text(
                    f"spare_sandboxes = {args.spares}\nspare_idle_seconds = 30\n"
                )
                busy0 = busy_seconds()
                bare = batch_bare(image, n)
                busy_bare = busy_seconds() - busy0
                busy0, own0 = busy_seconds(), children_cpu()
                wall, lat, failures = batch_jobs(work, n, work / "home")
                busy_jobs, own = busy_seconds() - busy0, children_cpu() - own0
                rows.append(
                    [
                        str(n),
                        str(rnd + 1),
                        f"{bare:.1f} s",
                        f"{wall:.1f} s",
                        f"{wall / bare:.2f}x",
                        f"{percentile(lat, 50):.1f} s",
                        f"{percentile(lat, 99):.1f} s",
                        str(failures),
                        f"{busy_bare:.0f} s",
                        f"{busy_jobs:.0f} s",
                        f"{own:.0f} s",
                        f"{own / n:.2f} s",
                    ]
                )
    header = ["jobs", "round", "bare runs", "jobs wall", "ratio", "p50", "p99", "failures"]
    header += ["CPU bare", "CPU jobs", "of it patchbox", "patchbox/job"]
    print_table(header, rows)
    print(f"load after: {loadavg()}")


if __name__ == "__main__":
    main()
