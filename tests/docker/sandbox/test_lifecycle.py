"""A job's life when its controller dies, is signalled, or shares the daemon: attacks on the
real daemon, through the real CLI in a subprocess, under runc and gVisor.

- A controller killed with SIGKILL leaves no running sandbox for long (the agent ends when its
  channel closes), and the next command marks the job ``INTERRUPTED`` and removes what is left.
- A sandbox whose channel closes while its agent does not read it (unpacking a large baseline,
  waiting for a FIFO nobody will feed) stops within ``ORPHAN_STOP_SECONDS`` all the same.
- SIGTERM, SIGHUP and SIGINT cancel the job cleanly: ``cancelled``, no container, exit
  143, 129 and 130.
- Spares belong to the state directory that made them; a claim is atomic on the daemon.
- Nothing of the host user's paths shows in the sandbox's mountinfo.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import docker.errors
import pytest

from controller.config.limits import Limits
from controller.jobs.records import JobRecord
from controller.jobs.store import JobStore
from controller.paths import MOUNT_PREFIX, mount_staging_root, owned_temp_dir, patchbox_home
from controller.sandbox.base import Runtime, SandboxSpec
from controller.sandbox.cache import BaselineCache
from controller.sandbox.docker import ORPHAN_STOP_SECONDS, AttachChannel, container_config
from controller.sandbox.labels import (
    HOME,
    JOB,
    KIND,
    ControllerIdentity,
    current_identity,
    new_job_id,
)
from controller.sandbox.prepare import prepare
from controller.sandbox.reaper import reap
from controller.sandbox.spares import SparePool, pool_key
from tests.support.cli import job_files, patchbox
from tests.support.jobs import EDIT, GREET, call, check_call, make_repo
from tests.support.locks import held
from tests.support.paths import REPO_ROOT

pytestmark = pytest.mark.docker

ROOT = REPO_ROOT
HOLD_CHECK = {"argv": ["sh", "-c", "echo holding; sleep 120"], "timeout_seconds": 300}


def write_inputs(
    folder: Path, checks: dict[str, Any], turns: list[list[dict[str, Any]]], spares: int = 0
) -> list[str]:
    """The task, calls and config files; returns their CLI arguments."""
    task = {
        "prompt": "Capitalize the greeting.",
        "checks": checks,
        "baseline_checks": False,  # a holding check holds as a tool call only
        "limits": {"memory_mb": 512, "workspace_mb": 64, "tmp_mb": 32, "wall_seconds": 240},
    }
    calls = {"turns": turns, "final": "done"}
    return job_files(folder, task, calls, f"spare_sandboxes = {spares}\n")


def start_holding_job(repo: Path, tmp: Path, runtime: Runtime) -> subprocess.Popen[str]:
    """A ``patchbox run`` whose second call runs a check that sleeps for two minutes."""
    args = write_inputs(
        tmp / "inputs", {"hold": HOLD_CHECK}, [[call("c1", EDIT)], [check_call("c2", "hold")]]
    )
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "controller",
            "run",
            "--repo",
            str(repo),
            *args,
            "--runtime",
            runtime,
            "--json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=os.environ.copy(),
    )


def job_of(repo: Path) -> JobRecord | None:
    found = JobStore().all(str(repo.resolve()))
    return found[-1] if found else None


def running_after(client: docker.DockerClient, ids: set[str], seconds: float) -> list[str]:
    """The containers of ``ids`` still running once ``seconds`` have passed (returns as soon
    as none is)."""
    deadline = time.monotonic() + seconds
    while True:
        found = client.containers.list(all=True, sparse=True, filters={"label": JOB})
        running = [c.id or "" for c in found if c.id in ids and c.attrs["State"] == "running"]
        if not running or time.monotonic() >= deadline:
            return running
        time.sleep(0.1)


def job_containers(client: docker.DockerClient, job_id: str) -> list[Any]:
    return client.containers.list(all=True, filters={"label": f"{JOB}={job_id}"}, sparse=True)


def wait_for_check(client: docker.DockerClient, repo: Path, proc: subprocess.Popen[str]) -> str:
    """Waits until the job's first call is done and its sandbox runs (the holding check
    then runs, or is about to); returns the job id."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        record = job_of(repo)
        if record is not None and record.state == "running" and record.tool_calls:
            boxes = job_containers(client, record.job_id)
            if any(c.attrs["State"] == "running" for c in boxes):
                time.sleep(2.0)
                return record.job_id
        time.sleep(0.2)
    proc.kill()
    pytest.fail(f"the job never reached its check: {proc.communicate()}")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "greet")


@pytest.mark.usefixtures("sandbox_image")
def test_a_killed_controller_leaves_nothing_running_and_its_job_interrupted(
    docker_client: docker.DockerClient, repo: Path, tmp_path: Path, runtime: Runtime
) -> None:
    proc = start_holding_job(repo, tmp_path, runtime)
    job_id = wait_for_check(docker_client, repo, proc)
    boxes = {c.id or "" for c in job_containers(docker_client, job_id)}
    proc.kill()
    proc.wait(30)
    # No later command yet: the agent saw its channel close and ended the container.
    left = running_after(docker_client, boxes, ORPHAN_STOP_SECONDS)
    assert not left, f"the sandbox of a killed controller still runs after {ORPHAN_STOP_SECONDS} s"
    assert JobStore().load(job_id).state == "running"  # nobody has looked yet
    listed = patchbox("jobs", "--json")
    assert listed.returncode == 0, listed.stderr
    [entry] = [j for j in json.loads(listed.stdout)["jobs"] if j["job_id"] == job_id]
    assert entry["status"] == "failed"
    assert entry["error"]["code"] == "INTERRUPTED"
    assert job_containers(docker_client, job_id) == []  # the stopped container is reaped
    shown = json.loads(patchbox("show", job_id, "--json").stdout)
    assert (shown["status"], shown["error"]["code"]) == ("failed", "INTERRUPTED")
    dropped = patchbox("discard", job_id, "--json")
    assert dropped.returncode == 0, dropped.stderr
    assert json.loads(dropped.stdout)["status"] == "discarded"


@pytest.mark.usefixtures("sandbox_image")
@pytest.mark.parametrize(
    ("signum", "code"),
    [(signal.SIGTERM, 143), (signal.SIGHUP, 129), (signal.SIGINT, 130)],
    ids=["SIGTERM", "SIGHUP", "SIGINT"],
)
def test_a_signal_cancels_the_job_cleanly(
    docker_client: docker.DockerClient,
    repo: Path,
    tmp_path: Path,
    runtime: Runtime,
    signum: int,
    code: int,
) -> None:
    proc = start_holding_job(repo, tmp_path, runtime)
    job_id = wait_for_check(docker_client, repo, proc)
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    data = json.loads(out)
    assert data["job_id"] == job_id
    assert (data["status"], data["error"]["code"]) == ("cancelled", "CANCELLED")
    # the user's cancel, not what the stopped check's channel said when it closed
    reason = f"cancelled by the user ({signal.Signals(signum).name})"
    assert data["error"]["message"] == reason
    record = JobStore().load(job_id)
    assert record.state == "cancelled"
    assert record.error is not None
    assert record.error.message == reason
    assert job_containers(docker_client, job_id) == []
    assert "Traceback" not in err


# -- a controller gone while the agent does not read its channel ----------------------------

EMPTY_FILES = 100_000
"""Headers only, yet unpacking them takes seconds: about 3.5 s under runc and 12.5 s under
gVisor here, past the bound, when the agent did not watch its channel meanwhile."""


def tar_of_empty_files(path: Path, count: int) -> None:
    """A ustar archive of ``count`` empty files, written header by header (fast)."""
    import tarfile

    template = tarfile.TarInfo("d00/f000000")
    template.mode = 0o644
    header = bytearray(template.tobuf(tarfile.USTAR_FORMAT))
    base = sum(header) - sum(header[148:156]) + 8 * ord(" ") - sum(b"d00/f000000")
    with path.open("wb") as out:
        for i in range(count):
            name = f"d{i % 100:02d}/f{i:06d}".encode()
            header[0:11] = name
            header[148:156] = b"%06o\0 " % (base + sum(name))
            out.write(header)
        out.write(bytes(1024))


def start_unwatched(
    client: docker.DockerClient, image: str, runtime: Runtime, preload: Path
) -> tuple[str, AttachChannel]:
    """A sandbox started as the controller starts one (attached, then started), which will
    unpack ``preload``; returns its id and channel, once it runs."""
    spec = SandboxSpec(
        image=image,
        job_id=new_job_id(),
        runtime=runtime,
        preload=str(preload),
        limits=Limits(memory_mb=512, workspace_mb=128),
    )
    labels = current_identity().labels(spec.job_id, "sandbox")
    container = client.containers.create(**container_config(spec, labels))
    channel = AttachChannel(
        client.api.attach_socket(
            container.id or "", params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1}
        )
    )
    container.start()
    return container.id or "", channel


@pytest.mark.usefixtures("sandbox_image")
@pytest.mark.parametrize(
    ("runtime", "source"),
    [("runc", "fifo"), ("runc", "archive"), ("runsc", "archive")],
    indirect=["runtime"],
)
def test_a_sandbox_stops_soon_after_its_channel_even_while_it_unpacks(
    docker_client: docker.DockerClient, sandbox_image: str, runtime: Runtime, source: str
) -> None:
    """The controller dies before the agent's first read of its channel: either it started
    the sandbox on a FIFO and died before feeding it (the agent waits in the FIFO's open),
    or the sandbox unpacks a large baseline (the agent reads its channel after that)."""
    folder = owned_temp_dir(MOUNT_PREFIX, mount_staging_root())
    preload = folder / "baseline.tar"
    if source == "fifo":
        os.mkfifo(preload, 0o644)  # gVisor cannot mount one: the FIFO source is runc's
    else:
        tar_of_empty_files(preload, EMPTY_FILES)
        preload.chmod(0o644)
    cid = ""
    try:
        cid, channel = start_unwatched(docker_client, sandbox_image, runtime, preload)
        time.sleep(0.5)
        assert running_after(docker_client, {cid}, 0) == [cid]  # busy, not reading
        channel.close()  # the controller is gone
        started = time.monotonic()
        assert running_after(docker_client, {cid}, ORPHAN_STOP_SECONDS) == []
        took = time.monotonic() - started
        print(f"{runtime} {source}: stopped {took:.2f} s after its channel closed")
    finally:
        if cid:
            with contextlib.suppress(docker.errors.NotFound):
                docker_client.api.remove_container(cid, force=True)
        shutil.rmtree(folder, ignore_errors=True)


# -- spares and state directories ----------------------------------------------------------


@pytest.fixture
def spec(sandbox_image: str) -> SandboxSpec:
    return SandboxSpec(
        image=sandbox_image, job_id=new_job_id(), limits=Limits(memory_mb=512, workspace_mb=128)
    )


@pytest.fixture
def spares(docker_client: docker.DockerClient) -> Iterator[None]:
    """Removes this test's spares, whatever happened."""
    yield
    for c in docker_client.containers.list(
        all=True, filters={"label": f"{KIND}=spare"}, sparse=True
    ):
        if c.attrs["Labels"].get("io.patchbox.controller") == current_identity().token:
            try:
                c.remove(force=True)
            except docker.errors.NotFound:
                pass


@pytest.mark.usefixtures("spares")
def test_a_spare_is_never_used_or_removed_by_another_home(
    docker_client: docker.DockerClient,
    spec: SandboxSpec,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    archive = tmp_path / "empty.tar"
    archive.write_bytes(b"\0" * 1024)
    loaded = spec.model_copy(update={"preload": str(archive)})
    key = pool_key("0" * 40, spec)
    home_a = SparePool(docker_client, root=tmp_path / "a" / "spares", home="a" * 16)
    home_b = SparePool(docker_client, root=tmp_path / "b" / "spares", home="b" * 16)
    cid = home_a.offer(key, loaded, current_identity())
    assert cid is not None
    assert docker_client.containers.get(cid).labels[HOME] == "a" * 16
    assert home_b.claim(key, current_identity()) is None  # same key, other home
    # home b keeps one spare at most: it removes its own oldest, never home a's
    assert home_b.offer("k" * 32, loaded, current_identity()) is not None
    assert home_b.offer("j" * 32, loaded, current_identity()) is not None
    assert docker_client.containers.get(cid).status == "running"
    monkeypatch.setenv("PATCHBOX_HOME", str(tmp_path / "b"))
    reap(docker_client)  # another home's reaper
    assert docker_client.containers.get(cid).status == "running"
    claimed = home_a.claim(key, current_identity())
    assert claimed is not None
    assert claimed.id == cid


@pytest.mark.usefixtures("spares")
def test_a_claim_is_atomic_on_the_daemon(
    docker_client: docker.DockerClient, spec: SandboxSpec, tmp_path: Path
) -> None:
    """Two controllers whose claim files cannot see each other race for one spare: the
    daemon's rename lets exactly one win."""
    archive = tmp_path / "empty.tar"
    archive.write_bytes(b"\0" * 1024)
    key = pool_key("1" * 40, spec)
    pools = [
        SparePool(docker_client, root=tmp_path / f"claims{i}", home="c" * 16) for i in range(6)
    ]
    cid = pools[0].offer(key, spec.model_copy(update={"preload": str(archive)}), current_identity())
    assert cid is not None
    won: list[str | None] = [None] * len(pools)
    start = threading.Barrier(len(pools))

    def take(i: int) -> None:
        start.wait()
        got = pools[i].claim(key, ControllerIdentity(nonce=f"racer{i:03d}"))
        won[i] = got.id if got is not None else None

    threads = [threading.Thread(target=take, args=(i,)) for i in range(len(pools))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert [w for w in won if w is not None] == [cid]
    winners = [i for i, w in enumerate(won) if w is not None]
    losers = [p for i, p in enumerate(pools) if i not in winners]
    assert all(not (p.root / cid).exists() for p in losers)  # losers let their file go


@pytest.mark.usefixtures("sandbox_image", "spares")
def test_a_job_in_another_home_does_not_take_a_spare(
    docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    """Two repositories with the same tree: home a's job offers a spare for it; a job in
    home b must not start from that spare."""
    first = make_repo(tmp_path / "one")
    second = make_repo(tmp_path / "two")
    args = write_inputs(tmp_path / "inputs", {"greet": GREET}, [[call("c1", EDIT)]], spares=1)
    home_a, home_b = tmp_path / "home-a", tmp_path / "home-b"
    done = patchbox("run", "--repo", str(first), *args, "--json", home=home_a)
    assert done.returncode == 0, done.stderr
    assert running_spare_of(docker_client, home_a) is not None  # offered (started meanwhile)
    again = patchbox("run", "--repo", str(second), *args, "--json", home=home_b)
    assert again.returncode == 0, again.stderr
    job_b = json.loads(again.stdout)["job_id"]
    record = JobStore(home_b / "jobs").load(job_b)
    assert record.diagnostics["baseline_source"] != "spare"
    same_home = patchbox("run", "--repo", str(first), *args, "--json", home=home_a)
    job_a = json.loads(same_home.stdout)["job_id"]
    record = JobStore(home_a / "jobs").load(job_a)
    assert record.diagnostics["baseline_source"] == "spare"  # the spare was there to take
    for home in (home_a, home_b):
        env_reap(home)


def running_spare_of(client: docker.DockerClient, home: Path, wait: float = 30.0) -> str | None:
    """The id of a running spare of ``home``, waited for (a job ends once its spare's start
    is with the daemon, not when the spare runs); None if none runs within ``wait``."""
    deadline = time.monotonic() + wait
    while True:
        found = client.containers.list(
            filters={"label": [f"{KIND}=spare", f"{HOME}={_home_id(home)}"], "status": "running"},
            sparse=True,
        )
        if found:
            return found[0].id
        if time.monotonic() > deadline:
            return None
        time.sleep(0.1)


def env_reap(home: Path) -> None:
    """Removes the spares a subprocess home left (their controllers are gone)."""
    client = docker.from_env()
    try:
        for c in client.containers.list(all=True, filters={"label": f"{KIND}=spare"}, sparse=True):
            if c.attrs["Labels"].get(HOME) == _home_id(home):
                try:
                    c.remove(force=True)
                except docker.errors.NotFound:
                    pass
    finally:
        client.close()


def _home_id(home: Path) -> str:
    from controller.sandbox.labels import home_id

    return home_id(home)


# -- what the sandbox sees of the host -------------------------------------------------------


@pytest.mark.usefixtures("spares")
def test_no_host_user_path_in_the_sandbox_mountinfo(
    docker_client: docker.DockerClient,
    tmp_path: Path,
    sandbox_image: str,
    runtime: Runtime,
) -> None:
    repo = make_repo(tmp_path / "greet")
    cache = BaselineCache(tmp_path / "cache")
    pool = SparePool(docker_client, max_spares=1, idle_seconds=120)
    home = str(patchbox_home())
    secrets = {home, str(Path.home()), str(repo), str(tmp_path)}
    sources = []
    offered: list[str | None] = []
    # The first job offers a spare; the next ones take it (a loaded machine may make an offer
    # fail, so up to three tries), the last one has no pool and loads from the cache.
    for use_pool in (pool, pool, pool, pool, None):
        if use_pool is not None and "spare" in sources:
            continue
        spec = SandboxSpec(
            image=sandbox_image,
            job_id=new_job_id(),
            runtime=runtime,
            limits=Limits(memory_mb=512, workspace_mb=64),
        )
        prepared = prepare(
            docker_client, repo, spec, current_identity(), pool=use_pool, cache=cache
        )
        with prepared.sandbox as box:
            sources.append(prepared.source)
            seen = box.run(["cat", "/proc/self/mountinfo"], timeout=30).output
            assert "/workspace" in seen
            leaked = [s for s in secrets if s in seen]
            assert not leaked, (prepared.source, seen)
        offered.append(prepared.finish())
    assert sources[0] == ("fifo" if runtime == "runc" else "cache")
    assert "spare" in sources, (sources, offered)
    assert sources[-1] == "cache"


HELPER_MARK = "connection.recv(65536)"
"""A line of the helper's code (controller.sandbox.handover.HELPER), seen in its command line."""


def _helpers_running() -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if HELPER_MARK.encode() in argv:
            found.append(int(proc.name))
    return found


@pytest.mark.usefixtures("sandbox_image", "spares")
def test_a_job_ends_before_its_spare_runs_and_the_next_job_takes_it(
    docker_client: docker.DockerClient, repo: Path, tmp_path: Path, runtime: Runtime
) -> None:
    """A job ends once its spare's start is with the daemon. Afterwards the spare runs, the
    helper that waited for the daemon's answer has ended, the pool key's lock is free and
    the archive's mount name is gone; the next job on the same baseline, started at once,
    takes the spare (running or still starting)."""
    args = write_inputs(tmp_path / "inputs", {"greet": GREET}, [[call("c1", EDIT)]], spares=1)
    args += ["--runtime", runtime]
    home = tmp_path / "home"
    staging = mount_staging_root()
    before = {p.name for p in staging.iterdir() if p.name.startswith(MOUNT_PREFIX)}
    try:
        first = patchbox("run", "--repo", str(repo), *args, "--json", home=home)
        assert first.returncode == 0, first.stderr
        second = patchbox("run", "--repo", str(repo), *args, "--json", home=home)
        assert second.returncode == 0, second.stderr
        record = JobStore(home / "jobs").load(json.loads(second.stdout)["job_id"])
        assert record.diagnostics["baseline_source"] == "spare"
        assert running_spare_of(docker_client, home) is not None  # the second job's
        deadline = time.monotonic() + 30
        while _helpers_running() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _helpers_running() == []
        locks = list((home / "spares").glob("*.offer"))
        assert locks
        assert not any(held(lock) for lock in locks)
        after = {p.name for p in staging.iterdir() if p.name.startswith(MOUNT_PREFIX)}
        assert after - before == set()
    finally:
        env_reap(home)
