"""patchbox and SWE-ReX side by side, measured in one run, interleaved.

SWE-ReX (the ``swe-rex`` package: a FastAPI server, ``swerex-remote``, inside the container,
and its ``RemoteRuntime`` HTTP client on the host) is the peer. Its server image is built here
from the same local base image as patchbox's sandbox (no registry is reached for images): the
wheels of ``swe-rex`` are downloaded on the host with ``pip download`` and installed into a
venv in the image with ``pip install --no-index``. The image stays tagged
``patchbox-bench-swerex:<version>`` for the next run.

What is compared, each side alternating which goes first in every round:

1. ready: from nothing to the first tool call possible. patchbox: ``api.open_session`` on a
   small repository (health gate, private baseline, a hardened sandbox holding the
   repository, the agent's handshake), spares off; and for context the same with the
   default configuration, where the session claims the spare the previous one left (and
   offers one for the next while it runs). SWE-ReX, two ways: its
   ``DockerDeployment.start`` as shipped (``docker run`` + ``is_alive`` polled every 0.25 s)
   and the same server started with ``docker run -d`` and ``is_alive`` polled every 10 ms
   (the peer's best case). SWE-ReX's container starts empty: the repository's files are
   written into it afterwards and not counted;
2. ``read_file`` of a 1 KB file: a ``Session.call("read_file")`` (a whole turn of the engine:
   the loop's thread, the record written) against ``RemoteRuntime.read_file`` (one HTTP
   request on a new connection, as the client makes it). For context, in the same rotation:
   the same read on a bare sandbox (``DockerSandbox.read_file``: the channel, no engine
   turn) and the channel's floor (``cancel`` of a call that is not running; the agent has
   no echo operation);
3. a sequence of 100 tool calls: 50 reads, 20 listings, 19 searches, 10 writes and one
   command. patchbox: ``read_file``, ``list_files``, ``search_text``, ``replace_text`` and
   ``run_check`` (a configured ``python3 -c pass``); SWE-ReX: ``read_file``, ``execute`` of
   ``find`` and of ``grep -rn``, ``write_file`` of the whole file, ``execute`` of the same
   ``python3 -c pass``;
4. memory of an idle sandbox: several of each up at once, each having answered one
   ``read_file``; after a settle time the container's cgroup memory from the Docker stats
   API, ``usage`` and ``usage`` minus the file cache, for both alike.

Targets: read p50 at least 10x faster and ready at least 5x faster than SWE-ReX, idle
memory below it. Skipped, with a message, when ``swe-rex`` is not installed
(``pip install -e '.[bench]'``). Every container the bench starts is removed at the end.

    python3 bench/bench_peers.py [--rounds 8] [--read-rounds 20] [--per-round 10]
                                 [--mixed 4] [--idle 3]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from common import (
    SAMPLE,
    SAMPLE_PATH,
    cgroup_memory,
    fmt_ms,
    loadavg,
    make_repo,
    percentile,
    print_table,
    remove_labelled,
    sample_archive,
)

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    import docker

    from controller.api import Session

MB = 1024 * 1024
SWEREX_REPO = "patchbox-bench-swerex"
SERVER_PORT = 8000
"""The port ``swerex-remote`` listens on inside its container."""
WORKDIR = "/workspace"
CONFIG_PATH = "src/config.py"
N_MODULES = 20
RUN_ARGV = ["python3", "-c", "pass"]
READY_TARGET = 5.0
READ_TARGET = 10.0
TASK: dict[str, Any] = {
    "prompt": "bench: tool calls side by side",
    "checks": {"cmd": {"argv": RUN_ARGV, "timeout_seconds": 60}},
    "limits": {
        "memory_mb": 512,
        "workspace_mb": 64,
        "tmp_mb": 32,
        "wall_seconds": 3600,
        "max_turns": 10000,
        "max_tool_calls": 100000,
    },
}
Kind = Literal["read", "list", "search", "write", "run"]
PATTERN: tuple[Kind, ...] = (
    *("read", "read", "list", "read", "search"),
    *("read", "write", "read", "list", "search"),
)
"""Ten calls of the mixed sequence; the sequence's last call is the command run."""


# -- what both sides are given ----------------------------------------------------------


def repo_files() -> dict[str, str]:
    """The small repository both sides hold: the 1 KB sample, a config, 20 modules."""
    files = {SAMPLE_PATH: SAMPLE, CONFIG_PATH: "VALUE = 0\n"}
    for k in range(N_MODULES):
        body = "".join(
            f"def func_{k}_{j}(x):\n    return x + {j}  # value_{k}_{j}\n" for j in range(20)
        )
        files[f"src/mod{k:02d}.py"] = body
    return files


@dataclass(frozen=True)
class Step:
    kind: Kind
    path: str = ""
    query: str = ""


def mixed_sequence(n: int = 100) -> list[Step]:
    """The mixed tool sequence: ``PATTERN`` repeated, the last call a command run."""
    steps: list[Step] = []
    for i in range(n):
        kind: Kind = "run" if i == n - 1 else PATTERN[i % len(PATTERN)]
        k = i % N_MODULES
        if kind == "read":
            steps.append(Step(kind, path=f"src/mod{k:02d}.py"))
        elif kind == "search":
            steps.append(Step(kind, query=f"value_{k}_{i % 20}"))
        elif kind == "write":
            steps.append(Step(kind, path=CONFIG_PATH))
        else:
            steps.append(Step(kind))
    return steps


def time_calls(owner: type, name: str, into: list[float]) -> Callable[[], None]:
    """Wraps ``owner.name`` in this process to note each call's time; returns the undo."""
    original: Callable[..., Any] = getattr(owner, name)

    def wrapped(*a: Any, **k: Any) -> Any:
        started = time.perf_counter()
        try:
            return original(*a, **k)
        finally:
            into.append(time.perf_counter() - started)

    setattr(owner, name, wrapped)
    return lambda: setattr(owner, name, original)


def check(ok: bool, what: str) -> None:
    if not ok:
        raise SystemExit(f"benchmark sanity check failed: {what}")


# -- the peer ---------------------------------------------------------------------------


@dataclass
class Peer:
    """SWE-ReX's modules, loaded at run time (the package is only in the bench extra)."""

    version: str
    docker: Any
    remote: Any
    abstract: Any


def load_peer() -> Peer | None:
    # SWE-ReX logs every step at DEBUG to stdout; the tables must stay readable.
    os.environ.setdefault("SWE_REX_LOG_STREAM_LEVEL", "WARNING")
    try:
        version = metadata.version("swe-rex")
        return Peer(
            version,
            importlib.import_module("swerex.deployment.docker"),
            importlib.import_module("swerex.runtime.remote"),
            importlib.import_module("swerex.runtime.abstract"),
        )
    except (ImportError, metadata.PackageNotFoundError) as exc:
        print(
            f"bench_peers: skipped: swe-rex is not installed ({exc}); "
            "install the bench extra: pip install -e '.[bench]'",
            file=sys.stderr,
        )
        return None


def _image_exists(ref: str) -> bool:
    proc = subprocess.run(["docker", "image", "inspect", ref], capture_output=True, check=False)
    return proc.returncode == 0


DOCKERFILE = """\
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
COPY wheels /tmp/wheels
RUN python3 -m venv --without-pip /opt/swerex \\
 && /opt/swerex/bin/python3 /tmp/wheels/PIP_WHEEL/pip install -q --no-index --no-cache-dir \\
      --find-links /tmp/wheels swe-rex==VERSION \\
 && ln -s /opt/swerex/bin/swerex-remote /usr/local/bin/swerex-remote \\
 && rm -rf /tmp/wheels \\
 && swerex-remote --version
"""


def ensure_peer_image(client: docker.DockerClient, version: str) -> str:
    """``patchbox-bench-swerex:<version>``, built once from patchbox's base image."""
    from controller.sandbox.image import ImageBuilder

    tag = f"{SWEREX_REPO}:{version}"
    if _image_exists(tag):
        return tag
    base = ImageBuilder(client).status().get("base")
    if not isinstance(base, str):
        raise SystemExit("no base image: run `patchbox image build` first")
    print(f"building {tag} from {base} ...", file=sys.stderr)
    ask = "import sys; print('%d.%d' % sys.version_info[:2])"
    pyver = subprocess.run(
        ["docker", "run", "--rm", "--network=none", "--entrypoint=python3", base, "-c", ask],
        capture_output=True,
        check=True,
        text=True,
    ).stdout.strip()
    context = Path(tempfile.mkdtemp(prefix="bench-swerex-"))
    try:
        wheels = context / "wheels"
        download = [sys.executable, "-m", "pip", "download", "-q", "-d", str(wheels)]
        download += ["--only-binary=:all:", "--python-version", pyver, f"swe-rex=={version}"]
        subprocess.run([*download, "pip"], check=True)
        pip_wheel = next(p.name for p in wheels.glob("pip-*.whl"))
        text = DOCKERFILE.replace("PIP_WHEEL", pip_wheel).replace("VERSION", version)
        (context / "Dockerfile").write_text(text)
        build = ["docker", "build", "-q", "--force-rm", "--build-arg", f"BASE_IMAGE={base}"]
        subprocess.run(
            [*build, "-t", tag, str(context)],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    finally:
        shutil.rmtree(context, ignore_errors=True)
    return tag


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def docker_cli(argv: list[str]) -> int:
    """Runs the docker CLI with its output discarded; its exit status."""
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
    )
    return await proc.wait()


class PeerBox:
    """One SWE-ReX server in a container, and its client."""

    def __init__(self, peer: Peer, image: str, labels: dict[str, str]) -> None:
        self.peer = peer
        self.image = image
        self.labels = labels
        self.name = f"bench-swerex-{uuid.uuid4().hex[:12]}"
        self.deployment: Any = None
        self.runtime: Any = None
        self.value = 0

    def _label_args(self) -> list[str]:
        args: list[str] = []
        for key, value in self.labels.items():
            args += ["--label", f"{key}={value}"]
        return args

    async def start_stock(self) -> float:
        """``DockerDeployment.start`` as shipped (no pull: the image is local)."""
        started = time.perf_counter()
        self.deployment = self.peer.docker.DockerDeployment(
            image=self.image, pull="never", docker_args=self._label_args()
        )
        await self.deployment.start()
        elapsed = time.perf_counter() - started
        self.runtime = self.deployment.runtime
        self.name = str(self.deployment.container_name)
        return elapsed

    async def start_direct(self, poll: float = 0.01) -> float:
        """The same server from ``docker run -d`` on a loopback port, polled every 10 ms."""
        started = time.perf_counter()
        token = uuid.uuid4().hex
        port = free_port()
        argv = ["docker", "run", "-d", "--name", self.name, *self._label_args()]
        argv += ["-p", f"127.0.0.1:{port}:{SERVER_PORT}", self.image]
        argv += ["swerex-remote", "--auth-token", token]
        if await docker_cli(argv) != 0:
            raise SystemExit(f"could not start the SWE-ReX container: {argv}")
        self.runtime = self.peer.remote.RemoteRuntime(port=port, auth_token=token)
        deadline = started + 120
        while not await self.runtime.is_alive(timeout=1.0):
            if time.perf_counter() > deadline:
                raise SystemExit("the SWE-ReX server did not answer within 120 s")
            await asyncio.sleep(poll)
        return time.perf_counter() - started

    async def load(self, files: dict[str, str]) -> None:
        req = self.peer.abstract.WriteFileRequest
        for rel, text in files.items():
            await self.runtime.write_file(req(path=f"{WORKDIR}/{rel}", content=text))
        self.value = 0

    async def read(self, rel: str) -> str:
        req = self.peer.abstract.ReadFileRequest(path=f"{WORKDIR}/{rel}")
        response = await self.runtime.read_file(req)
        return str(response.content)

    async def _execute(self, argv: list[str]) -> Any:
        command = self.peer.abstract.Command(command=argv, shell=False, cwd=WORKDIR)
        return await self.runtime.execute(command)

    async def step(self, step: Step) -> None:
        if step.kind == "read":
            check(bool(await self.read(step.path)), "SWE-ReX read_file")
        elif step.kind == "list":
            out = await self._execute(["find", ".", "-type", "f"])
            check(SAMPLE_PATH in out.stdout, "SWE-ReX listing")
        elif step.kind == "search":
            out = await self._execute(["grep", "-rn", "--", step.query, "."])
            check(out.exit_code == 0, "SWE-ReX search")
        elif step.kind == "write":
            self.value += 1
            req = self.peer.abstract.WriteFileRequest
            content = f"VALUE = {self.value}\n"
            await self.runtime.write_file(req(path=f"{WORKDIR}/{step.path}", content=content))
        else:
            out = await self._execute(RUN_ARGV)
            check(out.exit_code == 0, "SWE-ReX command")

    async def close(self) -> float:
        """Stops the server and removes its container; a second call does nothing."""
        started = time.perf_counter()
        deployment, runtime = self.deployment, self.runtime
        self.deployment = self.runtime = None
        if deployment is not None:
            await deployment.stop()
        elif runtime is not None:
            try:
                await runtime.close()
            finally:
                await docker_cli(["docker", "rm", "-f", self.name])
        return time.perf_counter() - started


# -- patchbox ---------------------------------------------------------------------------


class Box:
    """One patchbox session driven through ``controller.api``."""

    def __init__(self, repo: Path, spares: int = 0) -> None:
        self.repo = repo
        self.spares = spares
        self.session: Session | None = None
        self.value = 0

    def start(self) -> float:
        from controller import api
        from controller.config.host import HostConfig
        from controller.config.task import TaskSpec

        task = TaskSpec.model_validate(TASK)
        started = time.perf_counter()
        config = HostConfig(spare_sandboxes=self.spares, spare_idle_seconds=600.0)
        self.session = api.open_session(self.repo, task=task, config=config)
        return time.perf_counter() - started

    def _call(self, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        assert self.session is not None  # noqa: S101 - started first
        result = self.session.call(tool, arguments)
        check(result.ok and result.result is not None, f"patchbox {tool}: {result.error}")
        return result.result or {}

    def read(self, rel: str) -> str:
        return str(self._call("read_file", {"path": rel}).get("content", ""))

    def step(self, step: Step) -> None:
        if step.kind == "read":
            check(bool(self.read(step.path)), "patchbox read_file")
        elif step.kind == "list":
            check(SAMPLE_PATH in self._call("list_files", {})["files"], "patchbox listing")
        elif step.kind == "search":
            check(bool(self._call("search_text", {"query": step.query})["hits"]), "search")
        elif step.kind == "write":
            old, new = f"VALUE = {self.value}", f"VALUE = {self.value + 1}"
            self._call("replace_text", {"path": step.path, "oldText": old, "newText": new})
            self.value += 1
        else:
            check(self._call("run_check", {"checkId": "cmd"}).get("exitCode") == 0, "run_check")

    def image(self, client: docker.DockerClient) -> str:
        """The image of this session's sandbox."""
        found = client.api.inspect_container(self.container_id(client))
        return str(found["Config"]["Image"])

    def container_id(self, client: docker.DockerClient) -> str:
        from controller.sandbox.labels import JOB

        assert self.session is not None  # noqa: S101 - started first
        found = client.containers.list(filters={"label": f"{JOB}={self.session.job_id}"})
        check(len(found) == 1, "one sandbox per session")
        return found[0].id or ""

    def close(self) -> float:
        started = time.perf_counter()
        if self.session is not None:
            self.session.close()
            self.session = None
        return time.perf_counter() - started


# -- the measurements -------------------------------------------------------------------


@dataclass
class Results:
    ready_box: list[float] = field(default_factory=list)
    ready_spare: list[float] = field(default_factory=list)
    ready_stock: list[float] = field(default_factory=list)
    ready_direct: list[float] = field(default_factory=list)
    close_box: list[float] = field(default_factory=list)
    close_peer: list[float] = field(default_factory=list)
    read_box: list[float] = field(default_factory=list)
    read_peer: list[float] = field(default_factory=list)
    read_bare: list[float] = field(default_factory=list)
    read_floor: list[float] = field(default_factory=list)
    read_save: list[float] = field(default_factory=list)
    mixed_box: list[float] = field(default_factory=list)
    mixed_peer: list[float] = field(default_factory=list)
    mem_box: list[tuple[int, int]] = field(default_factory=list)
    mem_peer: list[tuple[int, int]] = field(default_factory=list)


class Bench:
    def __init__(self, peer: Peer, image: str, repo: Path, labels: dict[str, str]) -> None:
        self.peer = peer
        self.image = image
        self.repo = repo
        self.labels = labels
        self.files = repo_files()
        self.results = Results()
        self.open_boxes: list[Box] = []
        self.open_peers: list[PeerBox] = []

    def new_box(self, spares: int = 0) -> Box:
        box = Box(self.repo, spares)
        self.open_boxes.append(box)
        return box

    def new_peer(self) -> PeerBox:
        box = PeerBox(self.peer, self.image, self.labels)
        self.open_peers.append(box)
        return box

    async def close_all(self) -> None:
        for box in self.open_boxes:
            box.close()
        for peer in self.open_peers:
            with contextlib.suppress(Exception):
                await peer.close()
        self.open_boxes.clear()
        self.open_peers.clear()

    async def ready_round(self, r: int) -> None:
        from controller import api

        res = self.results

        async def box_side() -> None:
            box = self.new_box()
            res.ready_box.append(box.start())
            check(box.read(SAMPLE_PATH) == SAMPLE, "patchbox's first read")
            res.close_box.append(box.close())

        async def spare_side() -> None:
            box = self.new_box(spares=1)
            res.ready_spare.append(box.start())
            check(box.read(SAMPLE_PATH) == SAMPLE, "patchbox's first read")
            job_id = box.session.job_id if box.session is not None else ""
            box.close()  # waits for the spare offered for the next round
            source = api.job(job_id).diagnostics.get("baseline_source")
            check(source == "spare", f"a spare served the session ({source})")

        async def stock_side() -> None:
            peer = self.new_peer()
            res.ready_stock.append(await peer.start_stock())
            await peer.load({SAMPLE_PATH: SAMPLE})
            check(await peer.read(SAMPLE_PATH) == SAMPLE, "SWE-ReX's first read")
            res.close_peer.append(await peer.close())

        async def direct_side() -> None:
            peer = self.new_peer()
            res.ready_direct.append(await peer.start_direct())
            await peer.load({SAMPLE_PATH: SAMPLE})
            check(await peer.read(SAMPLE_PATH) == SAMPLE, "SWE-ReX's first read")
            await peer.close()

        sides: list[Callable[[], Awaitable[None]]] = [
            box_side,
            stock_side,
            direct_side,
            spare_side,
        ]
        for k in range(len(sides)):
            await sides[(r + k) % len(sides)]()
        await self.close_all()

    async def reads(self, client: docker.DockerClient, args: argparse.Namespace) -> None:
        """``read_file`` on both sides, and for context the same read on a bare sandbox
        (no engine turn) and the channel's floor (``cancel`` of nothing), rotating."""
        from controller.config.limits import Limits
        from controller.jobs.store import JobStore
        from controller.sandbox.base import SandboxSpec
        from controller.sandbox.docker import DockerSandbox
        from controller.sandbox.labels import JOB, current_identity

        res = self.results
        box, peer = self.new_box(), self.new_peer()
        box.start()
        await peer.start_direct()
        await peer.load(self.files)
        spec = SandboxSpec(
            image=box.image(client),
            job_id=self.labels[JOB],
            runtime="runc",
            limits=Limits(memory_mb=512, workspace_mb=64, wall_seconds=3600),
        )
        bare = DockerSandbox.start(client, spec, current_identity())
        try:
            bare.put_archive(sample_archive())

            async def box_read() -> float:
                started = time.perf_counter()
                content = box.read(SAMPLE_PATH)
                elapsed = time.perf_counter() - started
                check(content == SAMPLE, "patchbox read_file's content")
                return elapsed

            async def peer_read() -> float:
                started = time.perf_counter()
                content = await peer.read(SAMPLE_PATH)
                elapsed = time.perf_counter() - started
                check(content == SAMPLE, "SWE-ReX read_file's content")
                return elapsed

            async def bare_read() -> float:
                started = time.perf_counter()
                content = bare.read_file(SAMPLE_PATH).content
                elapsed = time.perf_counter() - started
                check(content == SAMPLE, "the bare sandbox's content")
                return elapsed

            async def floor() -> float:
                started = time.perf_counter()
                answer = bare.session.call("cancel", {"target": 0}, 10.0)
                elapsed = time.perf_counter() - started
                check(answer == {"cancelled": False}, "cancel of nothing")
                return elapsed

            sides: list[tuple[Callable[[], Awaitable[float]], list[float]]] = [
                (box_read, res.read_box),
                (peer_read, res.read_peer),
                (bare_read, res.read_bare),
                (floor, res.read_floor),
            ]
            for _ in range(args.warmup):
                for fn, _into in sides:
                    await fn()
            restore = time_calls(JobStore, "save_turn", res.read_save)
            for r in range(args.read_rounds):
                for k in range(len(sides)):
                    fn, into = sides[(r + k) % len(sides)]
                    into += [await fn() for _ in range(args.per_round)]
            restore()
        finally:
            bare.close()
            await self.close_all()

    async def mixed(self, args: argparse.Namespace) -> None:
        res = self.results
        steps = mixed_sequence()
        for r in range(args.mixed):
            box, peer = self.new_box(), self.new_peer()
            box.start()
            await peer.start_direct()
            await peer.load(self.files)

            async def box_side(box: Box = box) -> None:
                started = time.perf_counter()
                for step in steps:
                    box.step(step)
                res.mixed_box.append(time.perf_counter() - started)

            async def peer_side(peer: PeerBox = peer) -> None:
                started = time.perf_counter()
                for step in steps:
                    await peer.step(step)
                res.mixed_peer.append(time.perf_counter() - started)

            for side in (box_side, peer_side) if r % 2 == 0 else (peer_side, box_side):
                await side()
            check(box.read(CONFIG_PATH) == await peer.read(CONFIG_PATH), "the same writes")
            await self.close_all()

    async def idle(self, client: docker.DockerClient, args: argparse.Namespace) -> None:
        res = self.results
        boxes: list[Box] = []
        peers: list[PeerBox] = []
        for i in range(args.idle):
            box, peer = (
                Box(make_repo(self.repo.parent / f"idle{i}", repo_files(), "bench files")),
                self.new_peer(),
            )
            self.open_boxes.append(box)
            box.start()
            check(box.read(SAMPLE_PATH) == SAMPLE, "patchbox read_file")
            await peer.start_direct()
            await peer.load({SAMPLE_PATH: SAMPLE})
            check(await peer.read(SAMPLE_PATH) == SAMPLE, "SWE-ReX read_file")
            boxes.append(box)
            peers.append(peer)
        await asyncio.sleep(args.settle)
        for box in boxes:
            stats = client.api.stats(box.container_id(client), stream=False, one_shot=True)
            res.mem_box.append(cgroup_memory(stats))
        for peer in peers:
            stats = client.api.stats(peer.name, stream=False, one_shot=True)
            res.mem_peer.append(cgroup_memory(stats))
        await self.close_all()


# -- report -----------------------------------------------------------------------------


def _ms(values: list[float]) -> str:
    return f"{percentile(values, 50) * 1000:.0f} ms"


def _max(values: list[float]) -> str:
    return f"{max(values) * 1000:.0f} ms"


def _yes(ok: bool) -> str:
    return "yes" if ok else "NO"


def _row(
    label: str, values: list[float], ratio: str, target: str = "-", met: str = "-"
) -> list[str]:
    return [label, str(len(values)), _ms(values), _max(values), ratio, target, met]


def report(res: Results) -> None:
    ready_stock = percentile(res.ready_stock, 50) / percentile(res.ready_box, 50)
    ready_direct = percentile(res.ready_direct, 50) / percentile(res.ready_box, 50)
    spare_stock = percentile(res.ready_stock, 50) / percentile(res.ready_spare, 50)
    spare_direct = percentile(res.ready_direct, 50) / percentile(res.ready_spare, 50)
    read_x = percentile(res.read_peer, 50) / percentile(res.read_box, 50)
    mixed_x = percentile(res.mixed_peer, 50) / percentile(res.mixed_box, 50)
    target = f">= {READY_TARGET:.0f}x"
    rows = [
        _row("ready: patchbox api.open_session", res.ready_box, "1"),
        _row("ready: SWE-ReX DockerDeployment.start", res.ready_stock, f"{ready_stock:.2f}x"),
        _row("ready: SWE-ReX docker run -d, 10 ms poll", res.ready_direct, f"{ready_direct:.2f}x"),
        _row("close: patchbox Session.close", res.close_box, "-"),
        _row("close: SWE-ReX DockerDeployment.stop", res.close_peer, "-"),
        _row("ready: patchbox, a spare waiting (default)", res.ready_spare, "1"),
        _row("  SWE-ReX DockerDeployment.start / it", res.ready_stock, f"{spare_stock:.2f}x"),
        _row("  SWE-ReX docker run -d, 10 ms poll / it", res.ready_direct, f"{spare_direct:.2f}x"),
    ]
    rows[1][5:] = [target, _yes(ready_stock >= READY_TARGET)]
    rows[2][5:] = [target, _yes(ready_direct >= READY_TARGET)]
    rows[6][5:] = [target, _yes(spare_stock >= READY_TARGET)]
    rows[7][5:] = [target, _yes(spare_direct >= READY_TARGET)]
    print_table(["ready", "n", "median", "max", "SWE-ReX / patchbox", "target", "met?"], rows)
    print()
    rows = []
    peer50 = percentile(res.read_peer, 50)
    for label, values, ratio in (
        ("read_file: patchbox Session.call", res.read_box, "1"),
        ("read_file: SWE-ReX RemoteRuntime", res.read_peer, f"{read_x:.2f}x"),
        ("context: of which the job record saved", res.read_save, "-"),
        (
            "context: read_file on a bare sandbox (no engine)",
            res.read_bare,
            f"{peer50 / percentile(res.read_bare, 50):.2f}x",
        ),
        (
            "context: the channel's floor (cancel of nothing)",
            res.read_floor,
            f"{peer50 / percentile(res.read_floor, 50):.2f}x",
        ),
    ):
        p50, p99 = fmt_ms(percentile(values, 50)), fmt_ms(percentile(values, 99))
        rows.append([label, str(len(values)), p50, p99, ratio, "-", "-"])
    rows[1][5:] = [f">= {READ_TARGET:.0f}x", _yes(read_x >= READ_TARGET)]
    print_table(["read", "n", "p50", "p99", "SWE-ReX / patchbox", "target", "met?"], rows)
    print()
    rows = [
        _row("100 mixed calls: patchbox", res.mixed_box, "1"),
        _row("100 mixed calls: SWE-ReX", res.mixed_peer, f"{mixed_x:.2f}x"),
    ]
    print_table(["sequence", "n", "median", "max", "SWE-ReX / patchbox", "target", "met?"], rows)
    print()
    rows = []
    for label, pick in (("cgroup usage", 0), ("cgroup usage - file cache", 1)):
        box = percentile([m[pick] / MB for m in res.mem_box], 50)
        peer = percentile([m[pick] / MB for m in res.mem_peer], 50)
        rows.append([f"idle, {label}: patchbox", str(len(res.mem_box)), f"{box:.1f} MB"])
        rows[-1] += [f"{max(m[pick] for m in res.mem_box) / MB:.1f} MB", "1", "-", "-"]
        rows.append([f"idle, {label}: SWE-ReX", str(len(res.mem_peer)), f"{peer:.1f} MB"])
        rows[-1] += [f"{max(m[pick] for m in res.mem_peer) / MB:.1f} MB", f"{peer / box:.2f}x"]
        rows[-1] += ["patchbox below", _yes(box < peer)]
    print_table(["memory", "n", "median", "max", "SWE-ReX / patchbox", "target", "met?"], rows)


async def run(args: argparse.Namespace, peer: Peer) -> int:
    from controller.sandbox.dockerclient import connect
    from controller.sandbox.image import ImageBuilder
    from controller.sandbox.labels import HOME, JOB, current_identity, home_id, new_job_id

    scratch = Path(tempfile.mkdtemp(prefix="bench-peers-"))
    os.environ["PATCHBOX_HOME"] = str(scratch / "home")  # its spares are this run's own
    client = connect()
    ImageBuilder(client).ensure()
    image = ensure_peer_image(client, peer.version)
    job_id = new_job_id()
    labels = current_identity().labels(job_id, "bench")
    repo = make_repo(scratch / "repo", repo_files(), "bench files")
    bench = Bench(peer, image, repo, labels)
    first = bench.new_box(spares=1)  # leaves the spare the first timed round claims
    first.start()
    first.close()
    print(
        f"SWE-ReX {peer.version}, image {image}; {time.strftime('%Y-%m-%d %H:%M:%S')}",
        file=sys.stderr,
    )
    print(f"load average at the start: {loadavg()}", file=sys.stderr)
    try:
        for r in range(args.warmup_rounds + args.rounds):
            await bench.ready_round(r)
            if r < args.warmup_rounds:
                bench.results = Results()
            print(f"ready round {r + 1} (load {loadavg()})", file=sys.stderr)
        await bench.reads(client, args)
        print(f"reads done (load {loadavg()})", file=sys.stderr)
        await bench.mixed(args)
        print(f"mixed sequences done (load {loadavg()})", file=sys.stderr)
        await bench.idle(client, args)
    finally:
        await bench.close_all()
        remove_labelled(client, f"{JOB}={job_id}")  # the peer's
        remove_labelled(client, f"{HOME}={home_id()}")  # patchbox's spares
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"load average at the end: {loadavg()}", file=sys.stderr)
    report(bench.results)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=8, help="measured ready rounds")
    parser.add_argument("--warmup-rounds", type=int, default=1)
    parser.add_argument("--read-rounds", type=int, default=20)
    parser.add_argument("--per-round", type=int, default=10, help="reads per side per round")
    parser.add_argument("--warmup", type=int, default=20, help="reads per side before measuring")
    parser.add_argument("--mixed", type=int, default=4, help="mixed sequences per side")
    parser.add_argument("--idle", type=int, default=3, help="idle sandboxes per side")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds idle before reading")
    args = parser.parse_args(argv)
    if min(args.rounds, args.read_rounds, args.per_round, args.mixed, args.idle) < 1:
        parser.error("--rounds, --read-rounds, --per-round, --mixed and --idle must be >= 1")
    peer = load_peer()
    if peer is None:
        return 0
    home = Path(tempfile.mkdtemp(prefix="bench-peers-home-"))
    os.environ["PATCHBOX_HOME"] = str(home)
    try:
        return asyncio.run(run(args, peer))
    finally:
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
