"""The service under load: several tenants submit jobs at once to ``patchbox serve`` on
loopback, measured in one run.

Each tenant has its own token, repository root and client thread; it submits its jobs (one
small repository each: a read, a replace, one check), then polls its job list until every
job has ended. Reported: API latency p50/p99 (each submit and each poll of the job list),
job throughput (jobs ended per minute of the batch), job latency p50/p99 (submit to the end
state as the list shows it, at the poll's resolution of 0.25 s), lost jobs (accepted but
missing from the tenant's list or not ended ``awaiting_review``) and leaked containers (any
container of the batch's jobs left once every job has ended).

With ``--reference N``, N jobs through the same service (one tenant, N workers) against N
of the job's container operations, bare, at once (``bench_concurrency.batch_ops``: N
``bench/bare_job.py`` processes, each sending one job's Docker API requests with the
standard library alone) and against N concurrent ``docker run --rm --network none IMAGE
true``, same round (the service and the bare operations in turn first): the cost of a whole
job in a long-running controller against the daemon's own work for it. With it, the CPU of
each side: the daemon's processes (``common.DaemonCpu``), the client's own (the service
process, or the bare processes: rusage) and the machine's busy seconds; the last lines are
the medians over the rounds.

    python3 bench/bench_service.py [--tenants 4] [--jobs 40] [--workers 4] [--reference 20]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import docker
import httpx

from bench_concurrency import (
    CALLS,
    TASK,
    Side,
    batch_bare,
    batch_ops,
    cpu_cells,
    greet_repo,
    median_row,
    ops_plan,
)
from common import DAEMON_GROUPS, loadavg, percentile, print_table, remove_labelled
from controller.sandbox.dockerclient import connect
from controller.sandbox.image import ImageBuilder
from controller.sandbox.labels import JOB

ROOT = Path(__file__).resolve().parent.parent
ENDED = frozenset({"awaiting_review", "applied", "failed", "cancelled", "discarded"})


@dataclass
class Tenant:
    name: str
    token: str
    root: Path
    max_concurrent_jobs: int


def write_config(folder: Path, tenants: list[Tenant], workers: int) -> Path:
    lines = ["spare_sandboxes = 0", "[service]", f'database = "{folder / "service.db"}"']
    lines.append(f"workers = {workers}")
    for tenant in tenants:
        tenant.root.mkdir(parents=True, exist_ok=True)
        lines += [
            "[[service.tenants]]",
            f'name = "{tenant.name}"',
            f'token_sha256 = "{hashlib.sha256(tenant.token.encode()).hexdigest()}"',
            f'repo_roots = ["{tenant.root}"]',
            f"max_concurrent_jobs = {tenant.max_concurrent_jobs}",
            "max_queued_jobs = 100",
        ]
    path = folder / "config.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def tenants_in(folder: Path, count: int, max_concurrent_jobs: int) -> list[Tenant]:
    return [
        Tenant(f"t{i}", f"token-{i}-{os.urandom(8).hex()}", folder / f"t{i}", max_concurrent_jobs)
        for i in range(count)
    ]


@contextmanager
def serving(config: Path, home: Path) -> Iterator[str]:
    """``patchbox serve`` as its own process on a free loopback port; SIGTERM at the end."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "controller",
            "--quiet",
            "serve",
            "--config",
            str(config),
            "--port",
            str(port),
        ],
        cwd=ROOT,
        env={**os.environ, "PATCHBOX_HOME": str(home)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            msg = f"the service did not start: {proc.communicate()[1][-2000:]}"
            raise RuntimeError(msg)
        time.sleep(0.1)
    try:
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@dataclass
class Load:
    """What a batch measured."""

    wall: float = 0.0
    submits: list[float] = field(default_factory=list)
    polls: list[float] = field(default_factory=list)
    jobs: list[float] = field(default_factory=list)
    accepted: list[str] = field(default_factory=list)
    statuses: dict[str, str] = field(default_factory=dict)
    refused: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def lost(self) -> list[str]:
        return [j for j in self.accepted if self.statuses.get(j) != "awaiting_review"]

    def api(self) -> list[float]:
        return self.submits + self.polls


def _tenant_run(url: str, tenant: Tenant, repos: list[Path], load: Load, timeout: float) -> None:
    headers = {"Authorization": f"Bearer {tenant.token}"}
    with httpx.Client(base_url=url, headers=headers, timeout=60) as client:
        sent: dict[str, float] = {}
        for repo in repos:
            body = {"repo": str(repo), "task": TASK, "calls": CALLS}
            t0 = time.perf_counter()
            response = client.post("/v1/jobs", json=body)
            elapsed = time.perf_counter() - t0
            with load.lock:
                load.submits.append(elapsed)
                if response.status_code == 202:
                    job_id = str(response.json()["job_id"])
                    load.accepted.append(job_id)
                    sent[job_id] = time.monotonic()
                else:
                    load.refused.append(response.text[:200])
        deadline = time.monotonic() + timeout
        pending = dict(sent)
        while pending and time.monotonic() < deadline:
            t0 = time.perf_counter()
            listed = client.get("/v1/jobs").json()["jobs"]
            elapsed = time.perf_counter() - t0
            now = time.monotonic()
            with load.lock:
                load.polls.append(elapsed)
                for job in listed:
                    if job["job_id"] in pending and job["status"] in ENDED:
                        load.statuses[job["job_id"]] = job["status"]
                        load.jobs.append(now - pending.pop(job["job_id"]))
            time.sleep(0.25)


def run_load(url: str, repos: dict[str, tuple[Tenant, list[Path]]], timeout: float) -> Load:
    """Every tenant's jobs, submitted at once from one thread per tenant, to their end."""
    load = Load()
    threads = [
        threading.Thread(target=_tenant_run, args=(url, tenant, paths, load, timeout))
        for tenant, paths in repos.values()
    ]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    load.wall = time.monotonic() - started
    return load


def leaked(client: docker.DockerClient, job_ids: list[str]) -> list[str]:
    names = []
    for job_id in job_ids:
        found = client.containers.list(all=True, filters={"label": f"{JOB}={job_id}"})
        names += [c.name or "" for c in found]
    return names


def batch(work: Path, tenants: int, jobs: int, workers: int, max_concurrent: int) -> Load:
    """``jobs`` jobs spread over ``tenants`` tenants through one service."""
    group = tenants_in(work / "roots", tenants, max_concurrent)
    config = write_config(work, group, workers)
    repos = {
        t.name: (t, [greet_repo(t.root / f"repo{i}", i) for i in range(i0, jobs, tenants)])
        for i0, t in enumerate(group)
    }
    with serving(config, work / "home") as url:
        return run_load(url, repos, timeout=900)


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def reference_round(
    plan: Path, rnd: int, args: argparse.Namespace
) -> tuple[list[str], list[list[str]]]:
    """``args.reference`` jobs through one service against as many bare job operations and
    bare ``docker run`` (``args.image``, ``args.root``); the wall row and the CPU rows."""
    n = args.reference
    ops, service, bare = (Side(args.root, args.run_id) for _ in range(3))
    ref = Load()
    for step in ("ops", "service") if rnd % 2 == 0 else ("service", "ops"):
        if step == "ops":
            with ops:
                ops.wall, ops.failures = batch_ops(plan, n)
        else:
            with tempfile.TemporaryDirectory(prefix="bench-service-ref-") as tmp, service:
                ref = batch(Path(tmp), 1, n, n, n)
            service.wall = ref.wall
    with bare:
        bare.wall = batch_bare(args.image, n, label=f"{JOB}={args.run_id}-true")
    row = [
        str(rnd + 1),
        str(n),
        f"{ops.wall:.1f} s",
        f"{bare.wall:.1f} s",
        f"{ref.wall:.1f} s",
        f"{ref.wall / ops.wall:.2f}x",
        f"{ref.wall / bare.wall:.2f}x",
        f"{percentile(ref.jobs, 50):.1f} s" if ref.jobs else "-",
        f"{percentile(ref.jobs, 99):.1f} s" if ref.jobs else "-",
        f"{len(ref.lost) + len(ref.refused)} / {ops.failures}",
    ]
    cpu = [
        [str(rnd + 1), what, *cpu_cells(side.daemon, side.client, side.busy)]
        for what, side in (("ops, bare", ops), ("service", service), ("run true", bare))
    ]
    return row, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--tenants", type=int, default=4)
    parser.add_argument("--jobs", type=int, default=40)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--reference", type=int, default=20, help="0: no reference batch")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--skip-tenants", action="store_true", help="only the reference part")
    args = parser.parse_args()
    client = connect()
    info = ImageBuilder(client, lambda m: print(m, file=sys.stderr)).ensure()
    args.image = info.tag
    args.root = str(client.info().get("DockerRootDir", "/var/lib/docker"))
    run_id = args.run_id = f"bench-ops-{os.getpid()}-{int(time.time())}"
    print(f"load before: {loadavg()}")
    rows, ref_rows, cpu_rows = [], [], []
    with tempfile.TemporaryDirectory(prefix="bench-ops-") as plan_dir:
        plan = ops_plan(client, info, Path(plan_dir), run_id)
        try:
            for rnd in range(args.rounds):
                if not args.skip_tenants:
                    rows.append(tenants_round(client, rnd, args))
                if args.reference:
                    row, cpu = reference_round(plan, rnd, args)
                    ref_rows.append(row)
                    cpu_rows += cpu
        finally:
            remove_labelled(client, f"{JOB}={run_id}")
    if rows:
        print_table(
            [
                "round",
                "tenants x jobs",
                "workers",
                "submit p50",
                "submit p99",
                "list p50",
                "list p99",
                "wall",
                "throughput",
                "job p50",
                "job p99",
                "lost",
                "leaked",
            ],
            rows,
        )
    if ref_rows:
        ref_rows.append([*median_row([r[:9] for r in ref_rows], ["median", ref_rows[0][1]]), "-"])
        header = ["round", "jobs", "ops, bare", "run true", "service", "ratio ops"]
        print_table([*header, "ratio true", "job p50", "job p99", "lost / ops failures"], ref_rows)
        for what in ("ops, bare", "service", "run true"):
            mine = [r for r in cpu_rows if r[1] == what]
            cpu_rows.append(median_row(mine, ["median", what]))
        print("CPU seconds over each batch")
        print_table(
            [
                "round",
                "side",
                *DAEMON_GROUPS,
                "daemon side",
                "client",
                "machine busy",
                "others' containers",
            ],
            cpu_rows,
        )
    print(f"load after: {loadavg()}")


def tenants_round(client: docker.DockerClient, rnd: int, args: argparse.Namespace) -> list[str]:
    """The tenants' batch of one round; its row."""
    with tempfile.TemporaryDirectory(prefix="bench-service-") as tmp:
        per_tenant = max(1, args.workers // args.tenants)
        load = batch(Path(tmp), args.tenants, args.jobs, args.workers, per_tenant)
        left = leaked(client, load.accepted)
    return [
        str(rnd + 1),
        f"{args.tenants}x{args.jobs // args.tenants}",
        str(args.workers),
        ms(percentile(load.submits, 50)),
        ms(percentile(load.submits, 99)),
        ms(percentile(load.polls, 50)),
        ms(percentile(load.polls, 99)),
        f"{load.wall:.1f} s",
        f"{len(load.statuses) / load.wall * 60:.1f}/min",
        f"{percentile(load.jobs, 50):.1f} s" if load.jobs else "-",
        f"{percentile(load.jobs, 99):.1f} s" if load.jobs else "-",
        str(len(load.lost) + len(load.refused)),
        str(len(left)),
    ]


if __name__ == "__main__":
    main()
