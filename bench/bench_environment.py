"""Project environments: a first build vs ``docker build``, and a job's sandbox on one.

1. **First build.** ``EnvironmentBuilder.ensure`` of an environment nothing has built yet
   (plan, generated Dockerfile and context, the daemon's classic build, the image found),
   and the agent layer put on in one container and one commit, against the docker CLI's
   ``docker build`` of the whole recipe: what the builder itself hands the daemon (a second
   client records its ``api.build`` call instead of running it) with the sandbox
   Dockerfile's agent layer appended and the agent's files added. Each round gives each side
   a spec of its own with a round-unique variable (``BENCH_ROUND``), so that every layer
   after the base misses the build cache on both sides; the images of a round (and their
   intermediate layers) are removed at its end, so later rounds are cold too. The order of
   the two sides alternates from round to round, and dirty pages are synced before each
   build.
2. **Ready on an existing environment.** What a job does before its agent can work: find
   its image (``EnvironmentBuilder.ensure`` of an environment that exists, or
   ``ImageBuilder.ensure`` of the default sandbox image), then ``start_with_baseline``
   (create with the full hardening, the baseline's cached archive mounted and unpacked, the
   agent's handshake), then close (not timed). Interleaved, the order rotating; the same
   path on both sides, so only the image (and its lookup) differs. A context row gives the
   start alone, with the image already known.

The setup is small: ``python3 -c 'print(1)'`` and ``sh -c 'echo x > /opt/x'`` with one
input file. ``--pip`` adds ``apt-get install python3-pip`` and a ``pip install`` of one small
package (network-bound and noisy); patchbox's setup then reaches the package hosts through
its egress proxy, as ``--config``'s ``network.setup_default`` allows (required with
``--pip``), while the reference ``docker build`` uses the daemon's default network. Every
container and image the script makes is removed at
the end, also on Ctrl-C; the base image and images it did not make are never touched.

    python3 bench/bench_environment.py [--rounds 3] [--n 15] [--warmup 2]
                                       [--pip --config CONFIG.toml] [--runtime runc|runsc]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import docker.errors

from common import fmt_ms, loadavg, make_repo, print_table
from controller.config.environment import EnvironmentSpec
from controller.config.host import load_config
from controller.config.limits import Limits
from controller.config.network import setup_rules
from controller.errors import EnvironmentBuildError
from controller.paths import sandbox_image_dir
from controller.repo.baseline import Baseline, build_baseline
from controller.sandbox.base import Runtime, SandboxSpec
from controller.sandbox.cache import BaselineCache
from controller.sandbox.dockerclient import connect
from controller.sandbox.envbuild import EnvironmentBuilder, EnvironmentImage, SetupEgress
from controller.sandbox.environment import LABEL_KEY, agent_layer, seed_of, step_names
from controller.sandbox.image import ImageBuilder
from controller.sandbox.labels import JOB, current_identity, new_job_id
from controller.sandbox.prepare import start_with_baseline

if TYPE_CHECKING:
    from collections.abc import Callable

    import docker

BUILD_TARGET = 1.1
"""median(first build) must be at most 1.1 x median(docker build of the same Dockerfile)."""
READY_TARGET = 1.05
"""median(ready on the environment) must be at most 1.05 x median(ready on the default)."""

SETUP = [["python3", "-c", "print(1)"], ["sh", "-c", "echo x > /opt/x"]]
PIP_SETUP = [
    [
        "sh",
        "-c",
        (
            "apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y "
            "--no-install-recommends python3-pip && rm -rf /var/lib/apt/lists/*"
        ),
    ],
    [
        "python3",
        "-m",
        "pip",
        "install",
        "--no-cache-dir",
        "--break-system-packages",
        "--disable-pip-version-check",
        "-r",
        "requirements.txt",
    ],
]
REF_REPO = "patchbox-bench-ref"
OUTSIDE = "outside the steps"
"""Before the first step and after the last: patchbox's plan, context and image lookup; the
CLI's start; on both sides the context's upload and the daemon's unpacking of it."""


def progress(message: str) -> None:
    print(f"  {message}", file=sys.stderr, flush=True)


REPO_FILES = {
    "app.py": 'def greet(name):\n    return "hello " + name\n',
    "requirements.txt": "iniconfig==2.0.0\n",
    "README.md": "# bench\n",
}
"""The benchmark's repository: a module and a requirement the environment installs."""


@dataclass
class Owned:
    """What this run made: environment keys (their images and intermediate layers carry
    the key as a label), tags, and containers (by job id)."""

    keys: set[str] = field(default_factory=set)
    tags: set[str] = field(default_factory=set)
    job_id: str = field(default_factory=new_job_id)

    def remove_images(self, client: docker.DockerClient) -> None:
        """Removes the tags, then whatever image still carries one of the keys (a build
        interrupted half-way leaves its finished steps as untagged images), in passes,
        since a parent goes only after its children."""
        for tag in sorted(self.tags):
            try:
                client.images.remove(tag, force=False, noprune=False)
            except docker.errors.ImageNotFound:
                pass
            except docker.errors.APIError as exc:
                print(f"could not remove {tag}: {exc.explanation}", file=sys.stderr)
        self.tags.clear()
        removed = True
        while removed:
            removed = False
            for key in self.keys:
                for image in client.images.list(all=True, filters={"label": f"{LABEL_KEY}={key}"}):
                    try:
                        client.images.remove(image.id or "", force=False, noprune=False)
                    except docker.errors.APIError:
                        continue  # a child is still there (the next pass), or gone already
                    removed = True
        left = [
            image.id
            for key in self.keys
            for image in client.images.list(all=True, filters={"label": f"{LABEL_KEY}={key}"})
        ]
        if left:
            print(f"could not remove {len(left)} images of this run: {left}", file=sys.stderr)
        self.keys.clear()

    def remove_containers(self, client: docker.DockerClient) -> None:
        for container in client.containers.list(
            all=True, filters={"label": f"{JOB}={self.job_id}"}
        ):
            container.remove(force=True, v=True)


def spec_for(setup: list[list[str]], value: str) -> EnvironmentSpec:
    return EnvironmentSpec(setup=setup, inputs=["requirements.txt"], env={"BENCH_ROUND": value})


Steps = list[list[Any]]
"""[name, seconds] of each build step, in order; the agent layer's steps as one."""


@dataclass
class Captured:
    context: bytes
    kwargs: dict[str, Any]


def capture_build(spec: EnvironmentSpec, baseline: Baseline) -> Captured:
    """The Dockerfile and context the builder would hand the daemon for ``spec``, and the
    build's options, taken from its own ``api.build`` call (on a client of its own, whose
    call is recorded and not made)."""
    client = connect()
    seen: list[Captured] = []

    def record(**kwargs: Any) -> Any:
        seen.append(Captured(kwargs.pop("fileobj").getvalue(), kwargs))
        return iter(())

    client.api.build = record  # type: ignore[method-assign,assignment]
    try:
        EnvironmentBuilder(client).ensure(spec, baseline)
    except EnvironmentBuildError:
        pass  # "ended without an image": nothing was built, as meant
    finally:
        client.close()
    if len(seen) != 1:
        msg = "the builder did not call api.build exactly once"
        raise RuntimeError(msg)
    return Captured(with_agent_layer(seen[0].context, seed_of(spec)), seen[0].kwargs)


def with_agent_layer(context: bytes, seed: str | None) -> bytes:
    """The captured context made whole for ``docker build``: the seed (after a setup) and
    the sandbox Dockerfile's agent layer appended to the Dockerfile as their own steps, and
    the agent's files added (patchbox runs both in one container and one commit after the
    builder's steps)."""
    folder = sandbox_image_dir()
    out = io.BytesIO()
    with (
        tarfile.open(fileobj=io.BytesIO(context)) as src,
        tarfile.open(fileobj=out, mode="w") as tar,
    ):
        for member in src.getmembers():
            data = src.extractfile(member)
            body = data.read() if data is not None else b""
            if member.name == "Dockerfile":
                if seed is not None:
                    body += ("RUN " + json.dumps(["/bin/sh", "-c", seed]) + "\n").encode()
                body += agent_layer().encode()
                member.size = len(body)
            tar.addfile(member, io.BytesIO(body) if member.isfile() else None)
        extra = [("agent.py", folder / "agent.py")]
        extra += [
            (f"patchbox_agent/{p.name}", p)
            for p in sorted((folder / "patchbox_agent").glob("*.py"))
        ]
        for name, path in extra:
            info = tarfile.TarInfo(name)
            raw = path.read_bytes()
            info.size, info.mode = len(raw), 0o644
            tar.addfile(info, io.BytesIO(raw))
    return out.getvalue()


def docker_build(captured: Captured, tag: str, names: dict[int, str]) -> tuple[float, Steps]:
    """``docker build`` (classic builder) of the captured context, with the same memory
    bounds and options; returns its seconds and its steps' seconds, named as the builder
    names them (each step runs from its ``Step N/M`` line to the next, as patchbox times
    them)."""
    kwargs = captured.kwargs
    limits = kwargs["container_limits"]
    argv = ["docker", "build", "--force-rm", "--rm", "-t", tag]
    argv += ["--memory", str(limits["memory"]), "--memory-swap", str(limits["memswap"])]
    argv += ["--network", str(kwargs["network_mode"]), "-"]
    env = {**os.environ, "DOCKER_BUILDKIT": "0"}
    steps: Steps = []
    with tempfile.TemporaryFile() as context, tempfile.TemporaryFile() as err:
        context.write(captured.context)
        context.seek(0)
        started = time.perf_counter()
        with subprocess.Popen(
            argv, stdin=context, stdout=subprocess.PIPE, stderr=err, env=env
        ) as proc:
            assert proc.stdout is not None  # noqa: S101 - Popen contract with PIPE
            mark = started
            for line in proc.stdout:
                text = line.decode(errors="replace")
                number = text[5:].split("/", 1)[0]
                if text.startswith("Step ") and number.isdigit():
                    now = time.perf_counter()
                    if steps:
                        steps[-1][1] += now - mark
                    mark = now
                    name = names.get(int(number), "agent layer")
                    if not steps or steps[-1][0] != name:
                        steps.append([name, 0.0])
            if steps:  # the last step ends with the output, as patchbox's does
                steps[-1][1] += time.perf_counter() - mark
            code = proc.wait()
        elapsed = time.perf_counter() - started
        err.seek(0)
        if code != 0:
            msg = f"docker build failed ({code}): {err.read().decode(errors='replace')}"
            raise RuntimeError(msg)
    return elapsed, steps


def patchbox_build(
    client: docker.DockerClient, spec: EnvironmentSpec, baseline: Baseline
) -> tuple[float, EnvironmentImage]:
    started = time.perf_counter()
    built = EnvironmentBuilder(client, progress).ensure(spec, baseline)
    elapsed = time.perf_counter() - started
    if not built.built:
        msg = f"{built.tag} existed before its first build: the round is not cold"
        raise RuntimeError(msg)
    return elapsed, built


def dockerfile_steps(context: bytes) -> int:
    with tarfile.open(fileobj=io.BytesIO(context)) as tar:
        member = tar.extractfile("Dockerfile")
        assert member is not None  # noqa: S101 - a regular file in the builder's context
        text = member.read().decode()
    return sum(1 for line in text.splitlines() if line[:1].isalpha())


@dataclass
class BuildSamples:
    patchbox: list[float] = field(default_factory=list)
    reference: list[float] = field(default_factory=list)
    steps: dict[str, list[float]] = field(default_factory=dict)
    """Seconds per step and side: the step's name, then ``" patchbox"`` or ``" docker"``."""
    dockerfile_steps: int = 0

    def add_steps(self, side: str, steps: Steps, total: float) -> None:
        for name, seconds in steps:
            self.steps.setdefault(f"{name} {side}", []).append(seconds)
        outside = total - sum(seconds for _name, seconds in steps)
        self.steps.setdefault(f"{OUTSIDE} {side}", []).append(outside)

    def step_rows(self) -> list[list[str]]:
        rows = []
        for key, values in self.steps.items():
            name = key.removesuffix(" patchbox")
            if name == key:
                continue
            ref = self.steps.get(f"{name} docker", [])
            ours = statistics.median(values)
            theirs = statistics.median(ref) if ref else None
            rows.append(
                [
                    name,
                    str(len(values)),
                    fmt_s(ours),
                    fmt_s(theirs) if theirs is not None else "-",
                    fmt_s(ours - theirs) if theirs is not None else "-",
                ]
            )
        return rows


def measure_builds(  # noqa: PLR0913, PLR0917 - the bench's one call site reads best flat
    client: docker.DockerClient,
    baseline: Baseline,
    setup: list[list[str]],
    rounds: int,
    owned: Owned,
    builder: EnvironmentBuilder,
) -> BuildSamples:
    samples = BuildSamples()
    for rnd in range(rounds):
        ours = spec_for(setup, uuid.uuid4().hex)
        theirs = spec_for(setup, uuid.uuid4().hex)
        for spec in (ours, theirs):
            tag, key, _base, _files = builder.plan(spec, baseline)
            owned.keys.add(key)
            owned.tags.add(tag)
        ref_tag = f"{REF_REPO}:{uuid.uuid4().hex[:16]}"
        owned.tags.add(ref_tag)
        captured = capture_build(theirs, baseline)
        samples.dockerfile_steps = dockerfile_steps(captured.context)
        python = b'ensure-python.sh"]' in captured.context  # the step, not the file
        names = step_names(theirs, as_root=True, python=python)  # the default base: root

        def ours_side() -> None:
            seconds, built = patchbox_build(client, ours, baseline)  # noqa: B023 - run at once
            samples.patchbox.append(seconds)
            steps = [[step["name"], step["seconds"]] for step in built.steps]
            samples.add_steps("patchbox", steps, seconds)

        def ref_side() -> None:
            seconds, steps = docker_build(captured, ref_tag, names)  # noqa: B023 - run at once
            samples.reference.append(seconds)
            samples.add_steps("docker", steps, seconds)

        sides: list[Callable[[], None]] = [ours_side, ref_side]
        for k in range(2):
            os.sync()  # no side pays for the writes of the build or removal before it
            sides[(rnd + k) % 2]()
        print(
            f"build round {rnd + 1}/{rounds}: patchbox {samples.patchbox[-1]:.1f} s, "
            f"docker build {samples.reference[-1]:.1f} s (load {loadavg()})",
            file=sys.stderr,
            flush=True,
        )
        owned.remove_images(client)
    return samples


@dataclass
class ReadySamples:
    env_job: list[float] = field(default_factory=list)
    default_job: list[float] = field(default_factory=list)
    env_start: list[float] = field(default_factory=list)
    default_start: list[float] = field(default_factory=list)
    env_lookup: list[float] = field(default_factory=list)
    default_lookup: list[float] = field(default_factory=list)


@dataclass
class ReadySetup:
    client: docker.DockerClient
    baseline: Baseline
    env_spec: EnvironmentSpec
    sandbox: SandboxSpec
    cache: BaselineCache


def ready_once(setup: ReadySetup, *, environment: bool) -> tuple[float, float]:
    """(image lookup, start + baseline + handshake) of one job's sandbox, then closed."""
    t0 = time.perf_counter()
    if environment:
        image = EnvironmentBuilder(setup.client).ensure(setup.env_spec, setup.baseline)
        tag, built = image.tag, image.built
    else:
        info = ImageBuilder(setup.client).ensure()
        tag, built = info.tag, info.built
    t1 = time.perf_counter()
    if built:
        msg = f"{tag} was built during a measured round (the agent's files changed?)"
        raise RuntimeError(msg)
    spec = setup.sandbox.model_copy(update={"image": tag})
    box = start_with_baseline(setup.client, setup.baseline, spec, current_identity(), setup.cache)
    t2 = time.perf_counter()
    box.close()
    return t1 - t0, t2 - t1


def measure_ready(setup: ReadySetup, n: int, warmup: int) -> ReadySamples:
    for _ in range(warmup):
        ready_once(setup, environment=True)
        ready_once(setup, environment=False)
    samples = ReadySamples()
    for i in range(n):
        order = [True, False] if i % 2 == 0 else [False, True]
        for environment in order:
            lookup, start = ready_once(setup, environment=environment)
            if environment:
                samples.env_lookup.append(lookup)
                samples.env_start.append(start)
                samples.env_job.append(lookup + start)
            else:
                samples.default_lookup.append(lookup)
                samples.default_start.append(start)
                samples.default_job.append(lookup + start)
    return samples


def check_environment_sandbox(setup: ReadySetup) -> None:
    """The environment's sandbox has what its setup made, and the baseline."""
    image = EnvironmentBuilder(setup.client).ensure(setup.env_spec, setup.baseline)
    spec = setup.sandbox.model_copy(update={"image": image.tag})
    with start_with_baseline(
        setup.client, setup.baseline, spec, current_identity(), setup.cache
    ) as box:
        out = box.run(["sh", "-c", "cat /opt/x && cat app.py | wc -l"], timeout=60).output
    if out.split() != ["x", "2"]:
        msg = f"the environment's sandbox does not hold what it should: {out!r}"
        raise RuntimeError(msg)


def fmt_s(seconds: float) -> str:
    return f"{seconds:.2f} s" if abs(seconds) < 1 else f"{seconds:.1f} s"


def row(
    what: str,
    ours: list[float],
    ref: list[float],
    fmt: Callable[[float], str],
    target: float | None,
) -> list[str]:
    a, b = statistics.median(ours), statistics.median(ref)
    ratio = a / b
    goal = f"<= {target:g}x" if target is not None else "-"
    met = ("yes" if ratio <= target else "NO") if target is not None else "-"
    return [what, str(len(ours)), fmt(a), fmt(b), f"{ratio:.2f}x", goal, met]


def _setup_egress(config: str | None) -> SetupEgress:
    """What the setup may reach: the host configuration's ``network.setup_default``."""
    network = load_config(Path(config)).network if config else None
    build_id = new_job_id()
    return SetupEgress(
        setup_rules(None, network) if network is not None else (),
        name=f"patchbox-setup-{build_id}",
        labels=current_identity().labels(build_id, "egress"),
        outside=network.outside if network is not None else "bridge",
    )


def _arguments(argv: list[str] | None) -> tuple[argparse.Namespace, SetupEgress]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=3, help="first builds per side")
    parser.add_argument("--n", type=int, default=15, help="sandboxes per side (ready)")
    parser.add_argument("--warmup", type=int, default=2, help="sandboxes per side, not timed")
    parser.add_argument("--pip", action="store_true", help="add apt-get + pip install steps")
    parser.add_argument(
        "--config", help="host configuration whose network.setup_default the setup reaches"
    )
    parser.add_argument("--runtime", choices=["runc", "runsc"], default="runc")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.n < 1:
        parser.error("--rounds and --n must be at least 1")
    egress = _setup_egress(args.config)
    if args.pip and not egress.rules:
        parser.error("--pip needs --config with a network.setup_default of the package hosts")
    return args, egress


def main(argv: list[str] | None = None) -> int:
    args, egress = _arguments(argv)
    runtime: Runtime = args.runtime
    setup_steps = SETUP + (PIP_SETUP if args.pip else [])
    scratch = Path(tempfile.mkdtemp(prefix="bench-env-"))
    os.environ["PATCHBOX_HOME"] = str(scratch / "home")
    client = connect()
    per_round, whole_run = Owned(), Owned()
    default = ImageBuilder(client, progress).ensure()
    if default.built:
        whole_run.tags.add(default.tag)
    builder = EnvironmentBuilder(client, progress, egress=egress)
    print(
        f"default image {default.tag} (built now: {default.built}); base {default.base}; "
        f"{time.strftime('%Y-%m-%d %H:%M:%S')}; load {loadavg()}",
        file=sys.stderr,
    )
    try:
        repo = make_repo(scratch / "repo", REPO_FILES)
        baseline, _report = build_baseline(repo)
        # The environment of part 2, made first: its build also warms the base's layers.
        env_spec = spec_for(setup_steps, f"ready-{whole_run.job_id}")
        env_tag, env_key, _base, _files = builder.plan(env_spec, baseline)
        whole_run.keys.add(env_key)
        whole_run.tags.add(env_tag)
        print("building the environment of part 2 (not timed) ...", file=sys.stderr)
        builder.ensure(env_spec, baseline)
        builds = measure_builds(client, baseline, setup_steps, args.rounds, per_round, builder)
        cache = BaselineCache(scratch / "cache")
        cache.fill(baseline)  # both sides unpack the same cached archive
        ready_setup = ReadySetup(
            client,
            baseline,
            env_spec,
            SandboxSpec(
                image="",
                job_id=whole_run.job_id,
                runtime=runtime,
                limits=Limits(memory_mb=512, workspace_mb=128, wall_seconds=600),
            ),
            cache,
        )
        check_environment_sandbox(ready_setup)
        print(f"measuring ready on {env_tag} and {default.tag} ...", file=sys.stderr)
        ready = measure_ready(ready_setup, args.n, args.warmup)
    finally:
        whole_run.remove_containers(client)
        per_round.remove_images(client)
        whole_run.remove_images(client)
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"load average at the end: {loadavg()}", file=sys.stderr)
    pip = " + pip" if args.pip else ""
    rows = [
        row(
            f"first build{pip} ({builds.dockerfile_steps} Dockerfile steps) vs docker build",
            builds.patchbox,
            builds.reference,
            fmt_s,
            BUILD_TARGET,
        ),
        row(
            f"{runtime}: job sandbox ready, environment vs default image",
            ready.env_job,
            ready.default_job,
            lambda seconds: fmt_ms(seconds, whole=True),
            READY_TARGET,
        ),
        row(
            f"{runtime}: of it start + baseline + hello (context)",
            ready.env_start,
            ready.default_start,
            lambda seconds: fmt_ms(seconds, whole=True),
            None,
        ),
        row(
            f"{runtime}: of it image lookup (context)",
            ready.env_lookup,
            ready.default_lookup,
            lambda seconds: fmt_ms(seconds, whole=True),
            None,
        ),
    ]
    header = ["measurement", "n", "patchbox median", "reference median", "ratio"]
    print_table([*header, "target", "met"], rows)
    print()
    header = ["step of the build", "n", "patchbox median", "docker build median", "difference"]
    print_table(header, builds.step_rows())
    return 0


if __name__ == "__main__":
    sys.exit(main())
