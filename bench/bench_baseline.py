"""Baseline ready in the sandbox vs ``git worktree add --detach`` of the same repository.

Before every timed step the page cache is synced, so that no step pays for another's writes.
For each round, in this order, on the same repository (HEAD, clean work tree):

- reference: ``git worktree add --detach`` into a new folder on the disk (then removed,
  not timed), and a second reference into a folder on tmpfs (``/dev/shm``), like the
  sandbox's workspace: the first depends on the disk, the second only on git;
- first job: nothing cached and no spare: ``prepare()`` from the health gate to a greeted
  sandbox whose /workspace holds the baseline (runc: the sandbox started while the baseline
  is built, then a FIFO fed by ``git archive``; runsc: the archive cached first, then
  mounted), with its split: health check and baseline, then the rest;
- second job, spare: the first job offered a spare; after it has unpacked (a pause), a new
  ``prepare()`` claims it: health gate + baseline + attach + handshake;
- second job, cache only (no pool): the cached archive mounted and unpacked.

Every sandbox is checked for the right file count before it is closed. A small repository
(default 1,000 files) gets the first-job row too, with ``docker run --rm IMAGE true`` as
its reference.

    python3 bench/bench_baseline.py [--files 100000] [--small 1000] [--rounds 3]
                                    [--runtime runc|runsc]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import docker

from bench_tools import ensure_repo, git
from common import loadavg, print_table
from controller.config.limits import Limits
from controller.sandbox.base import Runtime, SandboxSpec
from controller.sandbox.cache import BaselineCache
from controller.sandbox.dockerclient import connect
from controller.sandbox.image import ImageBuilder
from controller.sandbox.labels import KIND, current_identity, new_job_id
from controller.sandbox.prepare import Prepared, prepare
from controller.sandbox.spares import SparePool


def worktree_add(repo: Path, under: str | None = None) -> float:
    target = Path(tempfile.mkdtemp(prefix="bench-wt-", dir=under)) / "wt"
    os.sync()  # no earlier step's dirty pages are flushed inside this one
    started = time.perf_counter()
    git(repo, "worktree", "add", "-q", "--detach", str(target))
    elapsed = time.perf_counter() - started
    git(repo, "worktree", "remove", "--force", str(target))
    shutil.rmtree(target.parent, ignore_errors=True)
    return elapsed


def docker_run_true(image: str, runtime: Runtime) -> float:
    argv = ["docker", "run", "--rm", f"--runtime={runtime}", "--network=none"]
    argv += ["--entrypoint=true", image]
    started = time.perf_counter()
    subprocess.run(
        argv,
        check=True,
        capture_output=True,
    )
    return time.perf_counter() - started


def timed_prepare(  # noqa: PLR0913, PLR0917 - the bench's one call site reads best flat
    client: docker.DockerClient,
    repo: Path,
    spec: SandboxSpec,
    cache: BaselineCache,
    pool: SparePool | None,
    files: int,
) -> tuple[float, Prepared]:
    job = spec.model_copy(update={"job_id": new_job_id()})
    os.sync()
    started = time.perf_counter()
    prepared = prepare(client, repo, job, current_identity(), cache=cache, pool=pool)
    elapsed = time.perf_counter() - started
    with prepared.sandbox as box:
        count = box.run(["sh", "-c", "find . -type f | wc -l"], timeout=600).output.strip()
        if int(count) < files:
            msg = f"the workspace holds {count} files, expected at least {files}"
            raise SystemExit(msg)
    return elapsed, prepared


def remove_spares(client: docker.DockerClient) -> None:
    token = current_identity().token
    for c in client.containers.list(all=True, filters={"label": f"{KIND}=spare"}):
        if c.labels.get("io.patchbox.controller") == token:
            c.remove(force=True)


def row(name: str, values: list[float], ref: float | None, target: float | None) -> list[str]:
    med = statistics.median(values)
    ratio = f"{med / ref:.2f}x" if ref else "-"
    goal = f"<= {target:g}x" if target else "-"
    met = ("yes" if med / ref <= target else "no") if ref and target else "-"
    times = [f"{med * 1000:.0f} ms", f"{max(values) * 1000:.0f} ms"]
    return [name, str(len(values)), *times, ratio, goal, met]


def report(
    m: dict[str, list[float]], args: argparse.Namespace, big: Path, sources: set[str]
) -> None:
    wt = statistics.median(m["wt"])
    shm = statistics.median(m["wt_shm"])
    s_ref = statistics.median(m["s_ref"])
    size_mb = sum(p.stat().st_size for p in big.rglob("*.py")) / 1e6
    print(f"\nrepo: {args.files} files, {size_mb:.0f} MB; runtime {args.runtime}; load {loadavg()}")
    print("sources: " + ", ".join(sorted(sources)))
    header = ["what", "n", "median", "max", "ratio", "target", "met"]
    print_table(
        header,
        [
            row("git worktree add --detach (reference)", m["wt"], None, None),
            row("first job: baseline ready in sandbox", m["first"], wt, 1.0),
            row("second job, same HEAD (spare)", m["spare"], wt, 0.1),
            row("second job, same HEAD (cache only)", m["cache"], wt, None),
            row("git worktree add into tmpfs (reference 2)", m["wt_shm"], None, None),
            row("first job vs reference 2", m["first"], shm, 1.0),
            row("  of which health check + baseline", m["first_baseline"], None, None),
            row("  of which the rest: sandbox ready and loaded", m["first_sandbox"], None, None),
            row("second job (spare) vs reference 2", m["spare"], shm, 0.1),
            row(f"docker run --rm true (reference, {args.small}-file row)", m["s_ref"], None, None),
            row(f"{args.small}-file repo: first job, ready", m["s"], s_ref, None),
        ],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--small", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runtime", choices=["runc", "runsc"], default="runc")
    parser.add_argument("--repo", type=Path, default=Path("/tmp/patchbox-bench-repo"))
    parser.add_argument("--pause", type=float, default=20.0, help="seconds for the spare")
    args = parser.parse_args()
    runtime: Runtime = args.runtime
    big, small = args.repo / str(args.files), args.repo / str(args.small)
    ensure_repo(big, args.files)
    ensure_repo(small, args.small)
    client = connect()
    image = ImageBuilder(client).ensure().tag
    scratch = Path(tempfile.mkdtemp(prefix="bench-baseline-"))
    spec = SandboxSpec(
        image=image,
        job_id="bench",
        runtime=runtime,
        limits=Limits(memory_mb=2048, workspace_mb=1024, wall_seconds=3600),
    )
    print(f"load at the start: {loadavg()}", flush=True)
    pool = SparePool(client, max_spares=1, idle_seconds=600)
    keys = ["wt", "wt_shm", "first", "first_baseline", "first_sandbox", "spare", "cache"]
    keys += ["s_ref", "s"]
    m: dict[str, list[float]] = {k: [] for k in keys}
    sources: set[str] = set()
    try:
        for i in range(args.rounds):
            m["wt"].append(worktree_add(big))
            m["wt_shm"].append(worktree_add(big, "/dev/shm"))
            cache = BaselineCache(scratch / f"cache{i}")
            remove_spares(client)
            elapsed, first = timed_prepare(client, big, spec, cache, pool, args.files)
            m["first"].append(elapsed)
            m["first_baseline"].append(first.timings_ms["baseline"] / 1000)
            m["first_sandbox"].append(first.timings_ms["sandbox"] / 1000)
            sources.add(f"first={first.source}")
            time.sleep(args.pause)  # the spare unpacks meanwhile
            elapsed, second = timed_prepare(client, big, spec, cache, pool, args.files)
            m["spare"].append(elapsed)
            sources.add(f"second={second.source}")
            remove_spares(client)
            elapsed, third = timed_prepare(client, big, spec, cache, None, args.files)
            m["cache"].append(elapsed)
            sources.add(f"cache-only={third.source}")
            m["s_ref"].append(docker_run_true(image, runtime))
            small_cache = BaselineCache(scratch / f"small{i}")
            m["s"].append(timed_prepare(client, small, spec, small_cache, None, args.small)[0])
            print(f"round {i + 1}/{args.rounds} done (load {loadavg()})", flush=True)
    finally:
        remove_spares(client)
        shutil.rmtree(scratch, ignore_errors=True)
    report(m, args, big, sources)


if __name__ == "__main__":
    main()
