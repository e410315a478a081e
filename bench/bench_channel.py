"""Round trip of a small ``read_file`` over the attach channel vs ``docker exec cat``.

One sandbox per runtime gets a ~1 KB text file through ``put_archive``; then the same file
is read, in interleaved blocks, through the agent's attach channel (``DockerSandbox.read_file``)
and with ``docker exec <container> cat <file>`` (the docker CLI, the reference). The table
gives p50/p99 of each and the ratio p50(channel) / p50(exec) against the targets.

    python3 bench/bench_channel.py [--runtime runc|runsc|both] [--calls 2000] [--exec-calls 100]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from common import SAMPLE_PATH, fmt_ms, loadavg, percentile, print_table, sample_archive
from controller.cli.demo.run import example_archive
from controller.config.limits import Limits
from controller.sandbox.base import Runtime, SandboxSpec
from controller.sandbox.docker import DockerSandbox
from controller.sandbox.dockerclient import connect
from controller.sandbox.image import ImageBuilder
from controller.sandbox.labels import current_identity, new_job_id

if TYPE_CHECKING:
    pass

SAMPLE_SIZE = 1024
TARGET_DIVISOR: dict[Runtime, int] = {"runc": 80, "runsc": 40}
"""Target: p50(channel) must be at most 1/N of p50(docker exec)."""


@dataclass
class Samples:
    channel: list[float]
    exec_: list[float]


def exec_cat(container_id: str) -> float:
    """One ``docker exec cat`` of the sample; returns its wall time in seconds."""
    argv = ["docker", "exec", container_id, "cat", f"/workspace/{SAMPLE_PATH}"]
    started = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, check=False)
    elapsed = time.perf_counter() - started
    if proc.returncode != 0 or len(proc.stdout) != SAMPLE_SIZE:
        msg = f"docker exec failed ({proc.returncode}): {proc.stderr.decode(errors='replace')}"
        raise RuntimeError(msg)
    return elapsed


def read_channel(box: DockerSandbox) -> float:
    started = time.perf_counter()
    result = box.read_file(SAMPLE_PATH)
    elapsed = time.perf_counter() - started
    if len(result.content) != SAMPLE_SIZE:
        raise RuntimeError("read_file returned the wrong content")
    return elapsed


def measure(image: str, runtime: Runtime, args: argparse.Namespace) -> Samples:
    client = connect()
    spec = SandboxSpec(
        image=image,
        job_id=new_job_id(),
        runtime=runtime,
        limits=Limits(memory_mb=512, workspace_mb=128, wall_seconds=3600),
    )
    samples = Samples([], [])
    with DockerSandbox.start(client, spec, current_identity()) as box:
        box.put_archive(example_archive())
        box.put_archive(sample_archive())
        container_id = box.container.id or ""
        for _ in range(args.warmup):
            read_channel(box)
        for _ in range(args.exec_warmup):
            exec_cat(container_id)
        # Interleaved blocks, so that a noisy moment touches both sides alike.
        rounds = max(args.exec_calls, 1)
        per_round = args.calls // rounds
        extra = args.calls - per_round * rounds
        for r in range(rounds):
            for _ in range(per_round + (1 if r < extra else 0)):
                samples.channel.append(read_channel(box))
            if r < args.exec_calls:
                samples.exec_.append(exec_cat(container_id))
    return samples


def rows_for(runtime: Runtime, samples: Samples) -> list[list[str]]:
    ch50 = percentile(samples.channel, 50)
    ex50 = percentile(samples.exec_, 50)
    ratio = ch50 / ex50
    divisor = TARGET_DIVISOR[runtime]
    met = ratio <= 1 / divisor
    return [
        [
            f"{runtime}: read_file over attach",
            str(len(samples.channel)),
            fmt_ms(ch50),
            fmt_ms(percentile(samples.channel, 99)),
            f"1/{1 / ratio:.0f} ({ratio:.4f})",
            f"<= 1/{divisor}",
            "yes" if met else "NO",
        ],
        [
            f"{runtime}: docker exec cat (reference)",
            str(len(samples.exec_)),
            fmt_ms(ex50),
            fmt_ms(percentile(samples.exec_, 99)),
            "1",
            "-",
            "-",
        ],
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--runtime", choices=["runc", "runsc", "both"], default="both")
    parser.add_argument("--calls", type=int, default=2000, help="measured channel calls")
    parser.add_argument("--exec-calls", type=int, default=100, help="measured docker exec calls")
    parser.add_argument("--warmup", type=int, default=200, help="channel calls before measuring")
    parser.add_argument("--exec-warmup", type=int, default=5, help="docker execs before measuring")
    args = parser.parse_args(argv)
    if args.calls < 1 or args.exec_calls < 1:
        parser.error("--calls and --exec-calls must be at least 1")
    runtimes: list[Runtime] = ["runc", "runsc"] if args.runtime == "both" else [args.runtime]
    image = ImageBuilder(connect()).ensure().tag
    print(f"image {image}; {time.strftime('%Y-%m-%d %H:%M:%S')}", file=sys.stderr)
    print(f"load average at the start: {loadavg()}", file=sys.stderr)
    rows: list[list[str]] = []
    for runtime in runtimes:
        print(f"measuring {runtime} ...", file=sys.stderr)
        rows += rows_for(runtime, measure(image, runtime, args))
    print(f"load average at the end: {loadavg()}", file=sys.stderr)
    print_table(["what", "n", "p50", "p99", "ratio vs reference", "target", "met?"], rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
