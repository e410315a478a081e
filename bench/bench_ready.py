"""Time to a ready sandbox, and to ready + close, vs ``docker run --rm ... true``.

"Ready" is ``DockerSandbox.start``: create (with every hardening option), attach, start, and
the agent's handshake. "Ready + close" adds ``close`` (streams closed, container force-removed).
The reference, measured in the same run and interleaved with it, is the docker CLI's
``docker run --rm --network none --entrypoint true IMAGE`` on the same runtime: create,
start, wait for exit and remove. Two more ``docker run`` lines give context: the bare
interpreter (``python3 -I -S -B -c pass``) and the interpreter importing the agent's modules,
which is the part of the handshake that a plain container does not have. A second table
splits start + close into phases, timed around the Docker API calls that DockerSandbox makes.

    python3 bench/bench_ready.py [--runtime runc|runsc|both] [--n 20] [--warmup 2]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from common import fmt_ms, loadavg, percentile, print_table
from controller.config.limits import Limits
from controller.sandbox.base import Runtime, SandboxSpec
from controller.sandbox.docker import DockerSandbox
from controller.sandbox.dockerclient import connect
from controller.sandbox.image import ImageBuilder
from controller.sandbox.labels import JOB, current_identity, new_job_id

if TYPE_CHECKING:
    from collections.abc import Callable

    import docker

TARGET_RATIO = 1.3
"""median(ready) must be at most 1.3 x median(docker run)."""


PHASES = ("create", "events + attach", "start", "hello", "close")


@dataclass
class Samples:
    ready: list[float] = field(default_factory=list)
    ready_close: list[float] = field(default_factory=list)
    docker_run: list[float] = field(default_factory=list)
    python_run: list[float] = field(default_factory=list)
    import_run: list[float] = field(default_factory=list)
    phases: dict[str, list[float]] = field(default_factory=lambda: {p: [] for p in PHASES})


class PhaseClock:
    """Notes when ``DockerSandbox`` enters and leaves the Docker API calls of interest.

    The client's API methods are wrapped on this client instance only (the controller's
    code is not touched), so one ``start`` + ``close`` splits into: create (create +
    inspect), events + attach (the OOM event stream and the attach socket), start (the
    daemon's start call: runtime, mounts, process), hello (the agent's start-up and
    handshake) and close.
    """

    CALLS = ("events", "attach_socket", "start", "remove_container")

    def __init__(self, client: docker.DockerClient) -> None:
        self.marks: dict[str, float] = {}
        for name in self.CALLS:
            self._wrap(client.api, name)

    def _wrap(self, api: object, name: str) -> None:
        original: Callable[..., Any] = getattr(api, name)
        marks = self.marks

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            marks[f"{name}>"] = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                marks[f"{name}<"] = time.perf_counter()

        setattr(api, name, wrapped)

    def split(self, t0: float, ready: float, closed: float) -> dict[str, float]:
        m = self.marks
        return {
            "create": m["events>"] - t0,
            "events + attach": m["attach_socket<"] - m["events>"],
            "start": m["start<"] - m["start>"],
            "hello": ready - m["start<"],
            "close": closed - ready,
        }


def one_sandbox(
    client: docker.DockerClient, clock: PhaseClock, spec: SandboxSpec, samples: Samples
) -> None:
    clock.marks.clear()
    t0 = time.perf_counter()
    box = DockerSandbox.start(client, spec, current_identity())
    ready = time.perf_counter()
    box.close()
    closed = time.perf_counter()
    samples.ready.append(ready - t0)
    samples.ready_close.append(closed - t0)
    for phase, seconds in clock.split(t0, ready, closed).items():
        samples.phases[phase].append(seconds)


AGENT_IMPORT = "import sys; sys.path.insert(0, '/opt/patchbox'); import patchbox_agent.server"


def one_docker_run(spec: SandboxSpec, python: str | None = None) -> float:
    """``docker run --rm`` of ``true`` (the reference) or of ``python3 -I -S -B -c PYTHON``."""
    labels = current_identity().labels(spec.job_id, "bench")
    argv = ["docker", "run", "--rm", "--network", "none", "--runtime", spec.runtime]
    for key, value in labels.items():
        argv += ["--label", f"{key}={value}"]
    if python is not None:
        argv += ["--entrypoint", "python3", spec.image, "-I", "-S", "-B", "-c", python]
    else:
        argv += ["--entrypoint", "true", spec.image]
    started = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, check=False)
    elapsed = time.perf_counter() - started
    if proc.returncode != 0:
        msg = f"docker run failed ({proc.returncode}): {proc.stderr.decode(errors='replace')}"
        raise RuntimeError(msg)
    return elapsed


def measure(client: docker.DockerClient, spec: SandboxSpec, n: int, warmup: int) -> Samples:
    clock = PhaseClock(client)
    for _ in range(warmup):
        one_sandbox(client, clock, spec, Samples())
        one_docker_run(spec)
        one_docker_run(spec, "pass")
        one_docker_run(spec, AGENT_IMPORT)
    samples = Samples()
    for i in range(n):
        # Rotate the order, so that no side always follows another's cleanup.
        steps: list[Callable[[], None]] = [
            lambda: one_sandbox(client, clock, spec, samples),
            lambda: samples.docker_run.append(one_docker_run(spec)),
            lambda: samples.python_run.append(one_docker_run(spec, "pass")),
            lambda: samples.import_run.append(one_docker_run(spec, AGENT_IMPORT)),
        ]
        for k in range(len(steps)):
            steps[(i + k) % len(steps)]()
    return samples


def rows_for(runtime: Runtime, samples: Samples) -> list[list[str]]:
    ref = percentile(samples.docker_run, 50)
    ready = percentile(samples.ready, 50)
    total = percentile(samples.ready_close, 50)
    n = str(len(samples.ready))
    return [
        [
            f"{runtime}: ready (create+attach+start+hello)",
            n,
            fmt_ms(ready, whole=True),
            fmt_ms(percentile(samples.ready, 90), whole=True),
            f"{ready / ref:.2f}x",
            f"<= {TARGET_RATIO}x",
            "yes" if ready / ref <= TARGET_RATIO else "NO",
        ],
        [
            f"{runtime}: ready + close",
            n,
            fmt_ms(total, whole=True),
            fmt_ms(percentile(samples.ready_close, 90), whole=True),
            f"{total / ref:.2f}x",
            "-",
            "-",
        ],
        [
            f"{runtime}: docker run --rm true (reference)",
            str(len(samples.docker_run)),
            fmt_ms(ref, whole=True),
            fmt_ms(percentile(samples.docker_run, 90), whole=True),
            "1",
            "-",
            "-",
        ],
        [
            f"{runtime}: docker run --rm python3 -c pass (context)",
            str(len(samples.python_run)),
            fmt_ms(percentile(samples.python_run, 50), whole=True),
            fmt_ms(percentile(samples.python_run, 90), whole=True),
            f"{percentile(samples.python_run, 50) / ref:.2f}x",
            "-",
            "-",
        ],
        [
            f"{runtime}: docker run --rm python3 -c 'import agent' (context)",
            str(len(samples.import_run)),
            fmt_ms(percentile(samples.import_run, 50), whole=True),
            fmt_ms(percentile(samples.import_run, 90), whole=True),
            f"{percentile(samples.import_run, 50) / ref:.2f}x",
            "-",
            "-",
        ],
    ]


def phase_rows(runtime: Runtime, samples: Samples) -> list[list[str]]:
    ready = percentile(samples.ready, 50)
    return [
        [
            f"{runtime}: {phase}",
            str(len(values)),
            fmt_ms(percentile(values, 50), whole=True),
            fmt_ms(percentile(values, 90), whole=True),
            f"{percentile(values, 50) / ready:.0%} of ready" if phase != "close" else "-",
        ]
        for phase, values in samples.phases.items()
    ]


def remove_leftovers(client: docker.DockerClient, job_id: str) -> None:
    """Removes any container of this run that an interrupt left behind."""
    for container in client.containers.list(all=True, filters={"label": f"{JOB}={job_id}"}):
        container.remove(force=True, v=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--runtime", choices=["runc", "runsc", "both"], default="both")
    parser.add_argument("--n", type=int, default=20, help="measured iterations per runtime")
    parser.add_argument("--warmup", type=int, default=2, help="iterations before measuring")
    args = parser.parse_args(argv)
    if args.n < 1:
        parser.error("--n must be at least 1")
    runtimes: list[Runtime] = ["runc", "runsc"] if args.runtime == "both" else [args.runtime]
    client = connect()
    image = ImageBuilder(client).ensure().tag
    job_id = new_job_id()
    print(f"image {image}; {time.strftime('%Y-%m-%d %H:%M:%S')}", file=sys.stderr)
    print(f"load average at the start: {loadavg()}", file=sys.stderr)
    rows: list[list[str]] = []
    phases: list[list[str]] = []
    try:
        for runtime in runtimes:
            print(f"measuring {runtime} ...", file=sys.stderr)
            spec = SandboxSpec(
                image=image,
                job_id=job_id,
                runtime=runtime,
                limits=Limits(memory_mb=512, workspace_mb=128, wall_seconds=600),
            )
            samples = measure(client, spec, args.n, args.warmup)
            rows += rows_for(runtime, samples)
            phases += phase_rows(runtime, samples)
    finally:
        remove_leftovers(client, job_id)
    print(f"load average at the end: {loadavg()}", file=sys.stderr)
    print_table(["what", "n", "median", "p90", "ratio vs reference", "target", "met?"], rows)
    print()
    print_table(["phase of start + close", "n", "median", "p90", "share"], phases)
    return 0


if __name__ == "__main__":
    sys.exit(main())
