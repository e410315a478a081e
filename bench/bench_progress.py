"""What a tool call's progress line costs, against the call itself, measured in one run.

Every tool call of a job ends in a ``CallDone`` event (``controller.jobs.calldone``): the loop
builds it from the call's arguments and result, and ``patchbox run`` writes its line
(``turn 3 read_file src/app.py``) to the terminal. This bench times that work (the event,
its line and the write of the line, to ``/dev/null``) against the call it reports: a small
``read_file`` over the sandbox's channel, in interleaved blocks on one sandbox.

    python3 bench/bench_progress.py [--runtime runc|runsc] [--calls 2000]
"""

from __future__ import annotations

import argparse
import json
import os
import time

from common import SAMPLE_PATH, fmt_ms, loadavg, percentile, print_table, sample_archive
from controller.config.limits import Limits
from controller.jobs.calldone import CallDone
from controller.providers.base import ToolCall
from controller.sandbox.base import Runtime, SandboxSpec
from controller.sandbox.docker import DockerSandbox
from controller.sandbox.dockerclient import connect
from controller.sandbox.image import ImageBuilder
from controller.sandbox.labels import current_identity, new_job_id


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runtime", choices=["runc", "runsc"], default="runc")
    parser.add_argument("--calls", type=int, default=2000)
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
    call = ToolCall(id="c1", name="read_file", arguments=json.dumps({"path": SAMPLE_PATH}))
    reads: list[float] = []
    lines: list[float] = []
    sink = os.open(os.devnull, os.O_WRONLY)
    try:
        with DockerSandbox.start(client, spec, current_identity()) as box:
            box.put_archive(sample_archive())
            for _ in range(50):  # warm-up
                box.read_file(SAMPLE_PATH)
            for turn in range(1, args.calls + 1):
                started = time.perf_counter()
                result = box.read_file(SAMPLE_PATH).model_dump(mode="json")
                reads.append(time.perf_counter() - started)
                started = time.perf_counter()
                line = CallDone.of(turn, call, result, None).line()
                os.write(sink, f"patchbox: [{turn:7.1f}s] {line}\n".encode())
                lines.append(time.perf_counter() - started)
    finally:
        os.close(sink)
    read, event = percentile(reads, 50), percentile(lines, 50)
    ratio = event / read
    print(f"\nruntime {runtime}; {args.calls} calls; load {loadavg()}")
    print_table(
        ["what", "p50", "p99"],
        [
            [
                "read_file over the channel (reference)",
                fmt_ms(read),
                fmt_ms(percentile(reads, 99)),
            ],
            ["CallDone event + its line + write", fmt_ms(event), fmt_ms(percentile(lines, 99))],
            ["ratio: the line's share of the call (p50)", f"{ratio:.2%}", ""],
        ],
    )


if __name__ == "__main__":
    main()
