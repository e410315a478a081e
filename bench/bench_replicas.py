"""Replicas of the service: one ``patchbox serve`` against two on one PostgreSQL database and
one Docker engine, the same batch of jobs, measured in one run.

A throwaway PostgreSQL cluster on loopback (Debian's server programs, :mod:`pgcluster`);
each batch gets a new database and a new ``$PATCHBOX_HOME``, which its replicas share. Each
replica is ``python3 -m controller serve`` as its own process with the same ``workers``. The
batch: ``--jobs`` small scripted jobs (a read, a replace, one check, then the required check in
a fresh sandbox) over ``--tenants`` tenants, each tenant's client thread submitting its jobs
at once, job ``n`` to replica ``n mod R`` and its event stream followed on replica ``n + 1
mod R`` (so with two replicas a stream is served by the replica that did not take the
submit). Reported per batch:

- **jobs/min**: jobs ended per minute, from the first submit to the last job's end event
  arriving on its stream;
- **submit p50/p99**: the latency of ``POST /v1/jobs`` as the client sees it;
- **event p50/p99**: the delivery of a state change, from the moment it was recorded (the
  time the database gave the event's row as it was inserted: the bench adds a column with a
  ``clock_timestamp()`` default to the events table of its own database) to its arrival on
  ``GET /v1/jobs/{id}/events`` at the client (same machine, same clock); only ``state``
  events recorded after the stream was opened (not those replayed at its start);
- **lost** (accepted but not ended ``awaiting_review``, or refused) and **leaked** (any
  container of the batch's jobs left once the replicas have stopped).

The order of the two batches alternates between rounds. Each round starts with the engine's
own floor: ``2 x --jobs`` concurrent ``docker run --rm --network none IMAGE true`` (a job starts
two containers), as a ceiling in jobs per minute. The summary gives medians over rounds and
the headline, two replicas' jobs/min over one replica's.

    python3 bench/bench_replicas.py [--rounds 3] [--tenants 4] [--jobs 24] [--workers 2]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psycopg

from bench_concurrency import CALLS, TASK, batch_bare, greet_repo
from common import loadavg, percentile, print_table, remove_labelled
from controller.sandbox.dockerclient import connect
from controller.sandbox.image import ImageBuilder
from controller.sandbox.labels import JOB
from controller.service.pgstore import PostgresStore
from pgcluster import Cluster, cluster

ROOT = Path(__file__).resolve().parent.parent
ENDED = frozenset({"awaiting_review", "applied", "no_change", "failed", "cancelled", "discarded"})
RECORDED = (
    "ALTER TABLE events ADD COLUMN bench_recorded DOUBLE PRECISION"
    " DEFAULT EXTRACT(EPOCH FROM clock_timestamp())"
)
"""The bench's own instrument on its own database: when each event's row was inserted."""
EVENT_COLUMNS = ["event p50", "event p99"]


@dataclass
class Tenant:
    name: str
    token: str
    root: Path


def write_config(folder: Path, tenants: list[Tenant], workers: int, dsn: str) -> Path:
    lines = ["spare_sandboxes = 0", "[service]", 'state = "postgres"', f'database = "{dsn}"']
    lines.append(f"workers = {workers}")
    for tenant in tenants:
        tenant.root.mkdir(parents=True, exist_ok=True)
        lines += [
            "[[service.tenants]]",
            f'name = "{tenant.name}"',
            f'token_sha256 = "{hashlib.sha256(tenant.token.encode()).hexdigest()}"',
            f'repo_roots = ["{tenant.root}"]',
            "max_concurrent_jobs = 64",
            "max_queued_jobs = 100",
        ]
    path = folder / "config.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


@dataclass
class Replica:
    proc: subprocess.Popen[bytes]
    url: str


def start_replica(config: Path, home: Path, log: Path) -> Replica:
    """``patchbox serve`` as its own process on a free loopback port, once it answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    argv = [sys.executable, "-m", "controller", "--quiet", "serve", "--config", str(config)]
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [*argv, "--port", str(port)],
            cwd=ROOT,
            env={**os.environ, "PATCHBOX_HOME": str(home)},
            stdout=out,
            stderr=out,
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return Replica(proc, url)
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            msg = f"patchbox serve did not start: {log.read_text()[-2000:]}"
            raise RuntimeError(msg)
        time.sleep(0.1)


def stop_replicas(replicas: list[Replica]) -> None:
    """SIGTERM to each (the service drains), then SIGKILL past 120 seconds."""
    for replica in replicas:
        if replica.proc.poll() is None:
            replica.proc.send_signal(signal.SIGTERM)
    for replica in replicas:
        try:
            replica.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            replica.proc.kill()
            replica.proc.wait()


@dataclass
class Load:
    """What a batch measured."""

    replicas: int
    started: float = 0.0
    wall: float = 0.0
    submits: list[float] = field(default_factory=list)
    lags: list[float] = field(default_factory=list)
    accepted: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    opened: dict[str, float] = field(default_factory=dict)
    arrivals: dict[tuple[str, int], float] = field(default_factory=dict)
    ends: dict[str, str] = field(default_factory=dict)
    last_arrival: float = 0.0
    leaked: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def lost(self) -> int:
        ok = sum(1 for j in self.accepted if self.ends.get(j) == "awaiting_review")
        return len(self.accepted) - ok + len(self.refused)

    @property
    def per_minute(self) -> float:
        return len(self.ends) / self.wall * 60 if self.wall else 0.0


def _follow(url: str, token: str, job_id: str, load: Load, deadline: float) -> None:
    """Reads the job's event stream to its end; each ``state`` event's arrival time."""
    headers = {"Authorization": f"Bearer {token}"}
    timeout = httpx.Timeout(60.0, connect=10.0)
    seq, kind, data = 0, "", ""
    with httpx.Client(base_url=url, headers=headers, timeout=timeout) as client:
        opened = time.time()
        with client.stream("GET", f"/v1/jobs/{job_id}/events") as response:
            for line in response.iter_lines():
                if line.startswith("id:"):
                    seq = int(line[3:].strip())
                elif line.startswith("event:"):
                    kind = line[6:].strip()
                elif line.startswith("data:"):
                    data = line[5:].strip()
                elif not line and kind:
                    now = time.time()
                    with load.lock:
                        load.last_arrival = max(load.last_arrival, now)
                        if kind == "state":
                            load.arrivals[(job_id, seq)] = now
                            state = str(json.loads(data).get("state", ""))
                            if state in ENDED:
                                load.ends[job_id] = state
                    kind = ""
                if time.monotonic() > deadline:
                    break
    with load.lock:
        load.opened[job_id] = opened


@dataclass
class Run:
    """One batch in flight: its replicas, what it measures, its event streams."""

    replicas: list[Replica]
    load: Load
    deadline: float
    streams: list[threading.Thread] = field(default_factory=list)


def _tenant_run(run: Run, tenant: Tenant, jobs: list[tuple[int, Path]]) -> None:
    headers = {"Authorization": f"Bearer {tenant.token}"}
    load, replicas = run.load, run.replicas
    clients = [httpx.Client(base_url=r.url, headers=headers, timeout=60) for r in replicas]
    try:
        for n, repo in jobs:
            body = {"repo": str(repo), "task": TASK, "calls": CALLS}
            t0 = time.perf_counter()
            response = clients[n % len(replicas)].post("/v1/jobs", json=body)
            elapsed = time.perf_counter() - t0
            with load.lock:
                load.submits.append(elapsed)
                if response.status_code != 202:
                    load.refused.append(response.text[:200])
                    continue
                job_id = str(response.json()["job_id"])
                load.accepted.append(job_id)
            url = replicas[(n + 1) % len(replicas)].url
            thread = threading.Thread(
                target=_follow, args=(url, tenant.token, job_id, load, run.deadline)
            )
            thread.start()
            with load.lock:
                run.streams.append(thread)
    finally:
        for client in clients:
            client.close()


def run_load(
    replicas: list[Replica], work: dict[str, tuple[Tenant, list[tuple[int, Path]]]]
) -> Load:
    """Every tenant's jobs submitted at once (one thread per tenant), each job's events
    followed to its end."""
    run = Run(replicas, Load(len(replicas)), time.monotonic() + 900)
    tenants = [
        threading.Thread(target=_tenant_run, args=(run, t, jobs)) for t, jobs in work.values()
    ]
    load = run.load
    load.started = time.time()
    for thread in tenants:
        thread.start()
    for thread in tenants:
        thread.join()
    for thread in run.streams:
        thread.join()
    load.wall = max(load.last_arrival - load.started, 1e-9)
    return load


def delivery_lags(dsn: str, load: Load) -> list[float]:
    """Each live ``state`` event's arrival minus the time its row was inserted."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT job_id, seq, bench_recorded FROM events"
            " WHERE type = 'state' AND job_id = ANY(%s)",
            (load.accepted,),
        ).fetchall()
    lags = []
    for job_id, seq, recorded in rows:
        arrived = load.arrivals.get((job_id, seq))
        if arrived is not None and recorded >= load.opened.get(job_id, float("inf")):
            lags.append(arrived - recorded)
    return lags


@dataclass
class Shape:
    replicas: int
    tenants: int
    jobs: int
    workers: int


def batch(pg: Cluster, folder: Path, shape: Shape) -> Load:
    """``shape.jobs`` jobs over its tenants through its replicas of one new database."""
    group = [
        Tenant(f"t{i}", f"token-{i}-{os.urandom(8).hex()}", folder / "roots" / f"t{i}")
        for i in range(shape.tenants)
    ]
    dsn = pg.database()
    PostgresStore(dsn).close()  # the service's schema, then the bench's column on it
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(RECORDED)
    config = write_config(folder, group, shape.workers, dsn)
    work = {
        t.name: (
            t,
            [(n, greet_repo(t.root / f"repo{n}", n)) for n in range(i, shape.jobs, shape.tenants)],
        )
        for i, t in enumerate(group)
    }
    home = folder / "home"
    home.mkdir()
    running: list[Replica] = []
    load = Load(shape.replicas)
    client = connect()
    try:
        running.extend(
            start_replica(config, home, folder / f"replica-{i}.log") for i in range(shape.replicas)
        )
        load = run_load(running, work)
    finally:
        stop_replicas(running)
        for job_id in load.accepted:
            left = client.containers.list(all=True, filters={"label": f"{JOB}={job_id}"})
            load.leaked += len(left)
            remove_labelled(client, f"{JOB}={job_id}")
    load.lags = delivery_lags(dsn, load)
    return load


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds >= 0.01 else f"{seconds * 1000:.1f} ms"


def row_of(rnd: int, load: Load, workers: int, jobs: int) -> list[str]:
    lags = load.lags or [float("nan")]
    return [
        str(rnd),
        str(load.replicas),
        f"{load.replicas}x{workers}",
        str(jobs),
        f"{load.wall:.1f} s",
        f"{load.per_minute:.1f}",
        ms(percentile(load.submits, 50)),
        ms(percentile(load.submits, 99)),
        ms(percentile(lags, 50)),
        ms(percentile(lags, 99)),
        str(len(load.lags)),
        str(load.lost),
        str(load.leaked),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tenants", type=int, default=4)
    parser.add_argument("--jobs", type=int, default=24)
    parser.add_argument("--workers", type=int, default=2, help="workers of each replica")
    args = parser.parse_args()
    client = connect()
    image = ImageBuilder(client, lambda m: print(m, file=sys.stderr)).ensure().tag
    print(f"load before: {loadavg()}")
    rows: list[list[str]] = []
    results: dict[int, list[Load]] = {1: [], 2: []}
    floors: list[float] = []
    with cluster() as pg:
        for rnd in range(1, args.rounds + 1):
            bare = batch_bare(image, 2 * args.jobs)
            floors.append(args.jobs / bare * 60)
            order = (1, 2) if rnd % 2 else (2, 1)
            for replicas in order:
                with tempfile.TemporaryDirectory(prefix="bench-replicas-") as tmp:
                    shape = Shape(replicas, args.tenants, args.jobs, args.workers)
                    load = batch(pg, Path(tmp), shape)
                results[replicas].append(load)
                rows.append(row_of(rnd, load, args.workers, args.jobs))
                print(
                    f"round {rnd}, {replicas} replica(s): {load.per_minute:.1f} jobs/min, "
                    f"load {loadavg()}",
                    file=sys.stderr,
                )
    header = ["round", "replicas", "workers", "jobs", "wall", "jobs/min", "submit p50"]
    header += ["submit p99", "event p50", "event p99", "events", "lost", "leaked"]
    print_table(header, rows)

    def med(values: list[float]) -> float:
        return statistics.median(values)

    summary = []
    for replicas in (1, 2):
        loads = results[replicas]
        summary.append(
            [
                f"{replicas} replica{'s' if replicas > 1 else ''}",
                f"{med([x.per_minute for x in loads]):.1f}",
                ms(med([percentile(x.submits, 50) for x in loads])),
                ms(med([percentile(x.submits, 99) for x in loads])),
                ms(med([percentile(x.lags, 50) for x in loads if x.lags] or [float("nan")])),
                ms(med([percentile(x.lags, 99) for x in loads if x.lags] or [float("nan")])),
            ]
        )
    ratios = [
        two.per_minute / one.per_minute
        for one, two in zip(results[1], results[2], strict=True)
        if one.per_minute
    ]
    summary.append([f"engine floor ({2 * args.jobs} bare runs)", f"{med(floors):.1f}"])
    summary[-1] += ["-"] * 4
    print()
    print_table(
        [f"median of {args.rounds}", "jobs/min", "submit p50", "submit p99", *EVENT_COLUMNS],
        summary,
    )
    print()
    one, two = (med([x.per_minute for x in results[r]]) for r in (1, 2))
    print(
        f"two replicas / one replica, jobs/min: {two / one:.2f}x of the medians; "
        f"per round {', '.join(f'{r:.2f}x' for r in ratios)} (median {med(ratios):.2f}x)"
    )
    print(f"load after: {loadavg()}")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
