"""From a repository to a ready sandbox: every way the baseline gets in, on the real daemon.

The workspace must equal what the user sees (HEAD plus, with consent, local changes), and
the user's repository must be byte-identical afterwards.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import docker.errors
import pytest

from controller.config.limits import Limits
from controller.errors import ErrorCode, PatchboxError, SandboxError
from controller.repo.health import SnapshotLimits
from controller.sandbox.base import Runtime, SandboxSpec
from controller.sandbox.cache import BaselineCache
from controller.sandbox.docker import DockerSandbox, container_config
from controller.sandbox.dockerclient import create_container, request_start, start_answer
from controller.sandbox.labels import (
    HOME,
    KIND,
    ControllerIdentity,
    current_identity,
    new_job_id,
)
from controller.sandbox.prepare import prepare
from controller.sandbox.reaper import reap
from controller.sandbox.spares import POOL_KEY, SparePool, pool_key
from tests.support.git import git
from tests.support.proxy import TcpProxy


def snapshot(repo: Path) -> dict[str, tuple[int, str]]:
    """Every entry of the work tree and .git: mode and content hash (or link target)."""
    out: dict[str, tuple[int, str]] = {}
    for dirpath, dirnames, filenames in os.walk(repo):
        for name in [*dirnames, *filenames]:
            path = Path(dirpath) / name
            st = path.lstat()
            if path.is_symlink():
                digest = str(path.readlink())
            elif path.is_file():
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
            else:
                digest = "dir"
            out[str(path.relative_to(repo))] = (st.st_mode, digest)
    return out


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """Committed files (one executable, one CRLF, a non-ASCII name), then local changes of
    every kind."""
    root = tmp_path / "repo"
    root.mkdir()
    git(root, "init", "-q")
    (root / "src").mkdir()
    (root / "src" / "app.py").write_text("def f():\n    return 1\n")
    (root / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (root / "run.sh").chmod(0o755)
    (root / "win.txt").write_bytes(b"a\r\nb\r\n")
    (root / "caf\u00e9.md").write_text("caf\u00e9\n")
    (root / "gone.txt").write_text("to be deleted\n")
    (root / ".gitignore").write_text("*.log\n")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "init")
    (root / "src" / "app.py").write_text("def f():\n    return 2\n")  # unstaged
    (root / "staged.txt").write_text("staged\n")
    git(root, "add", "staged.txt")
    (root / "new.txt").write_text("untracked\n")
    (root / "empty.txt").write_bytes(b"")
    (root / "debug.log").write_text("ignored\n")
    (root / "gone.txt").unlink()
    return root


def expected_files(root: Path) -> dict[str, str]:
    """What the user sees: tracked and untracked-not-ignored regular files."""
    listed = git(root, "ls-files", "-z", "--cached", "--others", "--exclude-standard")
    out = {}
    for rel in sorted(set(listed.split("\0")) - {""}):
        path = root / rel
        if path.is_file():
            out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def workspace_files(box: DockerSandbox) -> dict[str, str]:
    res = box.run(["sh", "-c", "find . -type f -print0 | xargs -0 sha256sum"], timeout=60)
    assert res.exit_code == 0, res.output
    out = {}
    for line in res.output.splitlines():
        digest, _, rel = line.partition("  ")
        out[rel.removeprefix("./")] = digest
    return out


@pytest.fixture
def spec(sandbox_image: str) -> SandboxSpec:
    return SandboxSpec(
        image=sandbox_image, job_id=new_job_id(), limits=Limits(memory_mb=512, workspace_mb=128)
    )


@pytest.fixture
def cache(tmp_path: Path) -> BaselineCache:
    """A cache of this test only (trees of equal content have equal ids across tests)."""
    return BaselineCache(tmp_path / "cache")


@pytest.fixture
def pool(docker_client: docker.DockerClient) -> Iterator[SparePool]:
    """A pool whose spares are removed after the test, whatever happened."""
    spares = SparePool(docker_client, max_spares=1, idle_seconds=300)
    yield spares
    for c in docker_client.containers.list(all=True, filters={"label": f"{KIND}=spare"}):
        if c.labels.get("io.patchbox.controller") == current_identity().token:
            c.remove(force=True)


def test_every_source_gives_the_work_tree_the_user_sees(
    docker_client: docker.DockerClient,
    repo: Path,
    spec: SandboxSpec,
    pool: SparePool,
    cache: BaselineCache,
) -> None:
    before = snapshot(repo)
    want = expected_files(repo)
    assert "debug.log" not in want
    assert "gone.txt" not in want
    assert "new.txt" in want
    assert "staged.txt" in want
    sources = []
    for use_pool in (True, True, False):
        job = spec.model_copy(update={"job_id": new_job_id()})
        prepared = prepare(
            docker_client,
            repo,
            job,
            current_identity(),
            mode="include-local-changes",
            pool=pool if use_pool else None,
            cache=cache,
        )
        with prepared.sandbox as box:
            sources.append(prepared.source)
            assert workspace_files(box) == want
            mode = box.run(["stat", "-c", "%a", "run.sh"], timeout=20).output.strip()
            assert mode == "755"
            assert box.run(["ls", "-a"], timeout=20).output.split().count(".git") == 0
        offered = prepared.finish()
        assert (offered is not None) == use_pool  # a claimed spare is not offered again
        # The sandbox started while the baseline was built (dirty tree: not HEAD's, so
        # the spare served instead) is gone too.
        left = docker_client.containers.list(
            all=True, filters={"label": f"io.patchbox.job={job.job_id}"}
        )
        assert left == []
    # first: nothing cached (FIFO); second: the spare the first one offered; third: the cache.
    assert sources == ["fifo", "spare", "cache"]
    assert snapshot(repo) == before


def test_clean_repo_needs_no_consent_and_dirty_repo_does(
    docker_client: docker.DockerClient, repo: Path, spec: SandboxSpec, cache: BaselineCache
) -> None:
    with pytest.raises(PatchboxError) as info:
        prepare(docker_client, repo, spec, current_identity(), cache=cache)
    assert info.value.code is ErrorCode.CONSENT_REQUIRED
    assert (
        docker_client.containers.list(all=True, filters={"label": f"io.patchbox.job={spec.job_id}"})
        == []
    )
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "all")
    prepared = prepare(docker_client, repo, spec, current_identity(), cache=cache)
    with prepared.sandbox as box:
        assert prepared.baseline.commit == prepared.baseline.head
        assert workspace_files(box) == expected_files(repo)


def test_blocked_repo_starts_no_container(
    docker_client: docker.DockerClient, repo: Path, spec: SandboxSpec, cache: BaselineCache
) -> None:
    with pytest.raises(PatchboxError) as info:
        prepare(
            docker_client,
            repo,
            spec,
            current_identity(),
            mode="include-local-changes",
            snapshot=SnapshotLimits(max_files=2),
            cache=cache,
        )
    assert info.value.code is ErrorCode.REPO_BLOCKED
    assert (
        docker_client.containers.list(all=True, filters={"label": f"io.patchbox.job={spec.job_id}"})
        == []
    )


@pytest.mark.runsc
def test_gvisor_loads_from_the_cache(
    docker_client: docker.DockerClient,
    repo: Path,
    spec: SandboxSpec,
    runtime: Runtime,
    cache: BaselineCache,
) -> None:
    """runsc cannot mount a FIFO: the archive is cached first, then mounted as a file."""
    job = spec.model_copy(update={"runtime": runtime})
    prepared = prepare(
        docker_client, repo, job, current_identity(), mode="include-local-changes", cache=cache
    )
    with prepared.sandbox as box:
        assert prepared.source == ("fifo" if runtime == "runc" else "cache")
        assert workspace_files(box) == expected_files(repo)


def test_remote_daemon_gets_the_baseline_through_the_channel(
    repo: Path, spec: SandboxSpec, monkeypatch: pytest.MonkeyPatch, cache: BaselineCache
) -> None:
    proxy = TcpProxy()
    monkeypatch.setenv("DOCKER_HOST", f"tcp://127.0.0.1:{proxy.port}")
    from controller.sandbox.dockerclient import connect

    client = connect()
    try:
        prepared = prepare(
            client, repo, spec, current_identity(), mode="include-local-changes", cache=cache
        )
        with prepared.sandbox as box:
            assert prepared.source == "channel"
            assert workspace_files(box) == expected_files(repo)
    finally:
        client.close()
        proxy.close()


def test_a_spare_is_claimed_once(
    docker_client: docker.DockerClient, spec: SandboxSpec, pool: SparePool, tmp_path: Path
) -> None:
    archive = tmp_path / "empty.tar"
    archive.write_bytes(b"\0" * 1024)
    key = pool_key("0" * 40, spec)
    loaded = spec.model_copy(update={"preload": str(archive)})
    cid = pool.offer(key, loaded, current_identity())
    assert cid is not None
    assert pool.offer(key, loaded, current_identity()) is None  # one is already waiting
    other = ControllerIdentity(nonce="othernon")
    first = pool.claim(key, current_identity())
    assert first is not None
    assert first.id == cid
    assert pool.claim(key, other) is None
    with DockerSandbox.claim(docker_client, loaded, first) as box:
        assert box.hello.preload is not None
        assert box.hello.preload.error is None
        assert box.list_files().files == []
    assert (pool.root / cid).exists()  # claimed while in use, and after
    with pytest.raises(docker.errors.NotFound):
        docker_client.containers.get(cid)
    assert pool.sweep() >= 1
    assert not (pool.root / cid).exists()


def test_a_spare_whose_start_is_still_on_its_way_is_claimed_and_started(
    docker_client: docker.DockerClient, spec: SandboxSpec, pool: SparePool, tmp_path: Path
) -> None:
    """A spare created and not started yet (its start sent by a job that ended, not carried
    out yet, or never) is offered to nobody else, and a job claims it, starts it and greets
    it."""
    archive = tmp_path / "empty.tar"
    archive.write_bytes(b"\0" * 1024)
    key = pool_key(hashlib.sha256(spec.job_id.encode()).hexdigest()[:40], spec)
    loaded = spec.model_copy(update={"preload": str(archive)})
    labels = {**current_identity().labels("spare", "spare"), POOL_KEY: key, HOME: pool.home}
    spare = loaded.model_copy(update={"idle_exit": 300.0, "job_id": "spare"})
    cid = create_container(docker_client, **container_config(spare, labels)).id or ""
    assert pool.waiting(key)
    assert pool.offer(key, loaded, current_identity()) is None  # one is on its way
    claimed = pool.claim(key, current_identity())
    assert claimed is not None
    assert claimed.id == cid
    with DockerSandbox.claim(docker_client, loaded, claimed) as box:
        assert box.hello.preload is not None
        assert box.hello.preload.error is None
        assert box.list_files().files == []
    with pytest.raises(docker.errors.NotFound):
        docker_client.containers.get(cid)


def test_a_start_sent_on_its_own_connection_runs_and_a_refusal_gives_the_daemons_reason(
    docker_client: docker.DockerClient, spec: SandboxSpec
) -> None:
    """``request_start`` + ``start_answer`` against the real daemon: a created container
    runs; a second start of it is answered ``304`` (no error); a container that is gone is
    a ``SandboxError`` naming it."""
    labels = current_identity().labels(spec.job_id, "sandbox")
    cid = create_container(docker_client, **container_config(spec, labels)).id or ""
    try:
        for _ in range(2):
            connection = request_start(docker_client, cid)
            assert connection is not None
            start_answer(connection)
        assert docker_client.api.inspect_container(cid)["State"]["Status"] == "running"
    finally:
        docker_client.api.remove_container(cid, force=True)
    connection = request_start(docker_client, cid)
    assert connection is not None
    with pytest.raises(SandboxError, match=r"(?i)no such container") as info:
        start_answer(connection)
    assert info.value.message.startswith("cannot start a spare sandbox: ")


def test_jobs_ending_together_on_one_baseline_start_one_spare(
    docker_client: docker.DockerClient, spec: SandboxSpec, pool: SparePool, tmp_path: Path
) -> None:
    """Six offers for the same pool key at once (six jobs on one baseline ending together)
    start one spare between them; the key's lock file goes with the next sweep."""
    archive = tmp_path / "empty.tar"
    archive.write_bytes(b"\0" * 1024)
    key = pool_key(hashlib.sha256(spec.job_id.encode()).hexdigest()[:40], spec)  # its own
    loaded = spec.model_copy(update={"preload": str(archive)})
    together = threading.Barrier(6)
    offered: list[str | None] = []

    def offer() -> None:
        together.wait()
        offered.append(pool.offer(key, loaded, current_identity()))

    threads = [threading.Thread(target=offer) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    started = [cid for cid in offered if cid is not None]
    assert len(offered) == 6
    assert len(started) == 1, offered
    listed = docker_client.containers.list(all=True, filters={"label": f"{POOL_KEY}={key}"})
    assert [c.id for c in listed] == started
    assert pool.offer(key, loaded, current_identity()) is None  # one is waiting
    assert (pool.root / f"{key}.offer").exists()
    pool.sweep()
    assert not (pool.root / f"{key}.offer").exists()
    assert [c.id for c in docker_client.containers.list(filters={"id": started[0]})] == started


def test_an_unclaimed_spare_ends_by_itself(
    docker_client: docker.DockerClient, spec: SandboxSpec, tmp_path: Path
) -> None:
    archive = tmp_path / "empty.tar"
    archive.write_bytes(b"\0" * 1024)
    pool = SparePool(docker_client, idle_seconds=1.0)
    cid = pool.offer(
        "k" * 32, spec.model_copy(update={"preload": str(archive)}), current_identity()
    )
    assert cid is not None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            docker_client.containers.get(cid)
        except docker.errors.NotFound:
            break
        time.sleep(0.2)
    else:
        pytest.fail("the idle spare is still there")


def test_reaper_keeps_waiting_spares_and_removes_abandoned_claims(
    docker_client: docker.DockerClient, spec: SandboxSpec, pool: SparePool, tmp_path: Path
) -> None:
    archive = tmp_path / "empty.tar"
    archive.write_bytes(b"\0" * 1024)
    loaded = spec.model_copy(update={"preload": str(archive)})
    cid = pool.offer("a" * 32, loaded, current_identity())
    assert cid is not None
    reap(docker_client)
    assert docker_client.containers.get(cid).status == "running"  # waiting: kept
    dead = ControllerIdentity(pid=2**22 + 7, nonce="deadbeef")
    (pool.root / cid).write_text(f"{dead.token}\n{dead.host}\n")
    report = reap(docker_client)
    assert cid[:12] in report.containers
    assert not (pool.root / cid).exists()
    with pytest.raises(docker.errors.NotFound):
        docker_client.containers.get(cid)


def test_removing_the_spares_leaves_one_a_live_controller_is_claiming(
    docker_client: docker.DockerClient, spec: SandboxSpec, pool: SparePool, tmp_path: Path
) -> None:
    """``prune --spares`` (``remove_all``): a waiting spare goes; one whose claim file a
    live controller holds is that controller's sandbox now and stays."""
    archive = tmp_path / "empty.tar"
    archive.write_bytes(b"\0" * 1024)
    loaded = spec.model_copy(update={"preload": str(archive)})
    two = SparePool(docker_client, max_spares=2, idle_seconds=300, root=pool.root, home=pool.home)
    waiting = two.offer("a" * 32, loaded, current_identity())
    taken = two.offer("b" * 32, loaded, current_identity())
    assert waiting is not None
    assert taken is not None
    claimant = ControllerIdentity(nonce="claimant")  # this process: alive
    assert two._take(taken, claimant)
    assert two.remove_all(current_identity()) == [waiting[:12]]
    with pytest.raises(docker.errors.NotFound):
        docker_client.containers.get(waiting)
    assert docker_client.containers.get(taken).status == "running"
    assert (two.root / taken).read_text().startswith(claimant.token)  # its claim kept
    two.release(taken)
    assert two.remove_all(current_identity()) == [taken[:12]]


def test_missing_archive_fails_cleanly(
    docker_client: docker.DockerClient, spec: SandboxSpec, tmp_path: Path
) -> None:
    archive = tmp_path / "not-a-tar"
    archive.write_bytes(b"garbage" * 200)
    job = spec.model_copy(update={"preload": str(archive)})
    with pytest.raises(SandboxError, match="baseline did not load"):
        DockerSandbox.start(docker_client, job, current_identity())
    assert (
        docker_client.containers.list(all=True, filters={"label": f"io.patchbox.job={spec.job_id}"})
        == []
    )


def test_pool_key_separates_what_must_not_be_shared(spec: SandboxSpec) -> None:
    base = pool_key("a" * 40, spec)
    assert pool_key("a" * 40, spec) == base
    assert pool_key("b" * 40, spec) != base
    assert pool_key("a" * 40, spec.model_copy(update={"runtime": "runsc"})) != base
    bigger = spec.model_copy(update={"limits": Limits(memory_mb=1024, workspace_mb=128)})
    assert pool_key("a" * 40, bigger) != base
    assert POOL_KEY.startswith("io.patchbox.")


def test_a_baseline_larger_than_the_workspace_is_a_limit(
    docker_client: docker.DockerClient, spec: SandboxSpec, tmp_path: Path, cache: BaselineCache
) -> None:
    root = tmp_path / "big"
    root.mkdir()
    git(root, "init", "-q")
    (root / "blob.bin").write_bytes(os.urandom(3 * 1024 * 1024))
    git(root, "add", "-A")
    git(root, "commit", "-qm", "big")
    small = spec.model_copy(update={"limits": Limits(memory_mb=256, workspace_mb=1)})
    with pytest.raises(PatchboxError) as info:
        prepare(docker_client, root, small, current_identity(), cache=cache)
    assert info.value.code is ErrorCode.LIMIT_EXCEEDED
    assert "workspace_mb=1" in info.value.message
    assert (
        docker_client.containers.list(all=True, filters={"label": f"io.patchbox.job={spec.job_id}"})
        == []
    )
