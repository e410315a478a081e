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
concurrent bare ``docker run --rm --network none IMAGE true``, same run: the cost of a whole
job in a long-running controller against the daemon's own start and stop of a container.

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

from bench_concurrency import CALLS, TASK, batch_bare, greet_repo
from common import loadavg, percentile, print_table
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


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--tenants", type=int, default=4)
    parser.add_argument("--jobs", type=int, default=40)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--reference", type=int, default=20, help="0: no reference batch")
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    client = connect()
    image = ImageBuilder(client, lambda m: print(m, file=sys.stderr)).ensure().tag
    print(f"load before: {loadavg()}")
    rows, ref_rows = [], []
    for rnd in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="bench-service-") as tmp:
            per_tenant = max(1, args.workers // args.tenants)
            load = batch(Path(tmp), args.tenants, args.jobs, args.workers, per_tenant)
            left = leaked(client, load.accepted)
            rows.append(
                [
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
            )
        if args.reference:
            n = args.reference
            bare = batch_bare(image, n)
            with tempfile.TemporaryDirectory(prefix="bench-service-ref-") as tmp:
                ref = batch(Path(tmp), 1, n, n, n)
            ref_rows.append(
                [
                    str(rnd + 1),
                    str(n),
                    f"{bare:.1f} s",
                    f"{ref.wall:.1f} s",
                    f"{ref.wall / bare:.2f}x",
                    f"{percentile(ref.jobs, 50):.1f} s" if ref.jobs else "-",
                    f"{percentile(ref.jobs, 99):.1f} s" if ref.jobs else "-",
                    str(len(ref.lost) + len(ref.refused)),
                ]
            )
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
        print_table(
            ["round", "jobs", "bare runs", "service", "ratio", "job p50", "job p99", "lost"],
            ref_rows,
        )
    print(f"load after: {loadavg()}")


if __name__ == "__main__":
    main()
