"""What a poll of a running check costs beyond its wait, against a read in the same run.

A ``run_check {"handle": H, "waitSeconds": S}`` call (``controller.tools.watch``) waits up
to ``S`` seconds for the check, then answers the output since the last answer. This bench
runs a check that prints a line every 50 ms, and times, through the tool executor (argument
parsing, the handle, the agent's ``run_poll`` over the channel, the answer):

- a poll with ``waitSeconds`` 0: all of it is cost;
- a poll with ``waitSeconds`` ``--wait`` (default 0.1 s): the time beyond the wait;
- a ``read_file`` call, the reference, in interleaved blocks on the same sandbox.

    python3 bench/bench_poll.py [--runtime runc|runsc] [--polls 500] [--wait 0.1]
"""

from __future__ import annotations

import argparse
import time

from common import SAMPLE_PATH, fmt_ms, loadavg, percentile, print_table, sample_archive
from controller.config.limits import Limits
from controller.config.task import CheckSpec
from controller.sandbox.base import Runtime, SandboxSpec
from controller.sandbox.docker import DockerSandbox
from controller.sandbox.dockerclient import connect
from controller.sandbox.image import ImageBuilder
from controller.sandbox.labels import current_identity, new_job_id
from controller.tools.executor import ToolExecutor

TICKING = CheckSpec(
    argv=["sh", "-c", "while :; do echo tick; sleep 0.05; done"], timeout_seconds=3600
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runtime", choices=["runc", "runsc"], default="runc")
    parser.add_argument("--polls", type=int, default=500)
    parser.add_argument("--wait", type=float, default=0.1)
    args = parser.parse_args()
    runtime: Runtime = args.runtime
    client = connect()
    image = ImageBuilder(client).ensure().tag
    spec = SandboxSpec(
        image=image,
        job_id=new_job_id(),
        runtime=runtime,
        limits=Limits(memory_mb=512, workspace_mb=128, wall_seconds=3600),
    )
    zero: list[float] = []
    beyond: list[float] = []
    reads: list[float] = []
    with DockerSandbox.start(client, spec, current_identity()) as box:
        box.put_archive(sample_archive())
        tools = ToolExecutor(box, checks={"ticking": TICKING})
        first = tools.execute(0, "start", "run_check", {"checkId": "ticking", "waitSeconds": 0})
        handle = (first.result or {})["handle"]
        for i in range(50):  # warm-up
            tools.execute(0, f"w{i}", "read_file", {"path": SAMPLE_PATH})
            tools.execute(0, f"p{i}", "run_check", {"handle": handle, "waitSeconds": 0})
        for i in range(1, args.polls + 1):
            started = time.perf_counter()
            answer = tools.execute(i, "r", "read_file", {"path": SAMPLE_PATH})
            reads.append(time.perf_counter() - started)
            started = time.perf_counter()
            polled = tools.execute(i, "z", "run_check", {"handle": handle, "waitSeconds": 0})
            zero.append(time.perf_counter() - started)
            started = time.perf_counter()
            waited = tools.execute(
                i, "w", "run_check", {"handle": handle, "waitSeconds": args.wait}
            )
            beyond.append(time.perf_counter() - started - args.wait)
            if not (answer.ok and polled.ok and (waited.result or {}).get("status") == "running"):
                raise SystemExit(f"a call failed: {answer}, {polled}, {waited}")
        tools.stop_check()
    read, cost = percentile(reads, 50), percentile(beyond, 50)
    print(f"\nruntime {runtime}; {args.polls} polls of each kind; load {loadavg()}")
    print_table(
        ["what", "p50", "p99"],
        [
            ["read_file call (reference)", fmt_ms(read), fmt_ms(percentile(reads, 99))],
            ["poll, waitSeconds 0", fmt_ms(percentile(zero, 50)), fmt_ms(percentile(zero, 99))],
            [
                f"poll, waitSeconds {args.wait:g}: beyond the wait",
                fmt_ms(cost),
                fmt_ms(percentile(beyond, 99)),
            ],
            ["ratio: a poll's cost beyond its wait / read_file (p50)", f"{cost / read:.2f}", ""],
        ],
    )


if __name__ == "__main__":
    main()
