"""The whole scripted demo job vs the sum of its unavoidable parts, measured in one run.

The job (``controller.cli.demo.run``'s task and calls on a fresh copy of the example) starts two
sandboxes (the job's and the fresh one of the required check) and runs the test suite four
times (once on the baseline before the first turn, twice through ``run_check``, once as the
required check). The reference parts:

- a container start: ``docker run --rm --network none IMAGE true`` (counted twice);
- the check's own run time: ``python3 -m pytest -q`` timed inside a running container on the
  same files (counted three times).

overhead = job - (2 x start + 4 x check); target <= 2 s. Each round also runs the same job with
``"baseline_checks": false``: the difference is what the run on the baseline costs, against
one check run.

    python3 bench/bench_job.py [--rounds 5] [--runtime runc|runsc]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from common import loadavg, print_table
from controller.cli.demo.run import CALLS, TASK, make_demo_repo
from controller.config.host import HostConfig
from controller.config.task import TaskSpec
from controller.jobs.engine import Job
from controller.jobs.request import JobRequest
from controller.jobs.store import JobStore
from controller.providers import ScriptedProvider, parse_calls
from controller.sandbox.base import Runtime
from controller.sandbox.dockerclient import connect
from controller.sandbox.image import ImageBuilder


def docker_run_true(image: str, runtime: Runtime) -> float:
    argv = ["docker", "run", "--rm", f"--runtime={runtime}", "--network=none"]
    argv += ["--entrypoint=true", image]
    started = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True)
    return time.perf_counter() - started


def check_time(image: str, runtime: Runtime, repo: Path) -> float:
    """pytest's own run time inside a container, timed there (no start, no exec cost)."""
    script = (
        "cp -r /src/. /tmp/w && cd /tmp/w && "
        "python3 -c 'import time,subprocess,sys; t=time.perf_counter(); "
        'subprocess.run([sys.executable,"-m","pytest","-q","-p","no:cacheprovider"]); '
        "print(time.perf_counter()-t)'"
    )
    argv = ["docker", "run", "--rm", f"--runtime={runtime}", "--network=none"]
    argv += ["-v", f"{repo}:/src:ro", "--entrypoint=sh", image, "-c", script]
    out = subprocess.run(argv, check=False, capture_output=True, text=True).stdout
    return float(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runtime", choices=["runc", "runsc"], default="runc")
    args = parser.parse_args()
    runtime: Runtime = args.runtime
    client = connect()
    image = ImageBuilder(client).ensure().tag
    scratch = Path(tempfile.mkdtemp(prefix="bench-job-"))
    store = JobStore(scratch / "jobs")
    jobs: list[float] = []
    bare: list[float] = []
    starts: list[float] = []
    checks: list[float] = []
    try:
        for i in range(args.rounds):
            for baseline_checks, times in ((True, jobs), (False, bare)):
                repo = make_demo_repo(scratch / f"calc{i}-{baseline_checks}")
                request = JobRequest(
                    repo=repo,
                    task=TaskSpec.model_validate({**TASK, "baseline_checks": baseline_checks}),
                    provider=ScriptedProvider(parse_calls(json.dumps(CALLS))),
                    config=HostConfig(spare_sandboxes=0),
                    runtime=runtime,
                )
                started = time.perf_counter()
                record = Job(client, request, store=store).run()
                times.append(time.perf_counter() - started)
                if record.state != "awaiting_review":
                    msg = f"the job ended {record.state}: {record.error}"
                    raise SystemExit(msg)
            starts.append(docker_run_true(image, runtime))
            checks.append(check_time(image, runtime, repo))
            print(f"round {i + 1}/{args.rounds} (load {loadavg()})", flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    job, start, check = (statistics.median(x) for x in (jobs, starts, checks))
    without = statistics.median(bare)
    parts = 2 * start + 4 * check
    overhead = job - parts
    print(f"\nruntime {runtime}; {args.rounds} rounds; load {loadavg()}")
    print_table(
        ["what", "median"],
        [
            ["docker run --rm true (reference: one container start)", f"{start * 1000:.0f} ms"],
            ["pytest -q inside a container (reference: one check run)", f"{check * 1000:.0f} ms"],
            ["unavoidable parts: 2 starts + 4 check runs", f"{parts * 1000:.0f} ms"],
            ["whole scripted demo job", f"{job * 1000:.0f} ms"],
            ['the same job, "baseline_checks": false', f"{without * 1000:.0f} ms"],
            [
                "the run on the baseline (difference; ratio to one check run)",
                f"{(job - without) * 1000:.0f} ms ({(job - without) / check:.2f}x)",
            ],
            [
                f"overhead (target <= 2000 ms): {'met' if overhead <= 2.0 else 'missed'}",
                f"{overhead * 1000:.0f} ms",
            ],
        ],
    )


if __name__ == "__main__":
    main()
