"""A throwaway PostgreSQL cluster for the benchmarks: Debian's server programs, a cluster
made in a temporary folder (as the ``postgres`` user when the bench runs as root: the server
refuses root), on a free loopback port, no fsync; stopped and its folder removed at the end."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg

USER = "patchbox"
INITDB_OPTIONS = ["-A", "trust", "-U", USER, "--no-sync", "-E", "UTF8"]


def server_bin() -> Path:
    """The folder of Debian's PostgreSQL server programs (the newest version installed)."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))
    if not found:
        msg = "PostgreSQL's server programs are not installed (Debian's postgresql package)"
        raise FileNotFoundError(msg)
    return found[-1].parent


@dataclass
class Cluster:
    folder: Path
    port: int
    bin: Path
    as_user: list[str]

    def dsn(self, name: str = "postgres") -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{name}"

    def database(self) -> str:
        """A new empty database; its DSN."""
        name = "bench_" + uuid.uuid4().hex[:12]
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}".encode())
        return self.dsn(name)

    def stop(self) -> None:
        argv = [str(self.bin / "pg_ctl"), "-D", str(self.folder / "data"), "-m", "fast", "stop"]
        subprocess.run([*self.as_user, *argv], capture_output=True, check=False)
        shutil.rmtree(self.folder, ignore_errors=True)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_cluster() -> Cluster:
    """Makes and starts a cluster in a new temporary folder (trust authentication, loopback
    only, no fsync: a bench's database, thrown away)."""
    programs = server_bin()
    folder = Path(tempfile.mkdtemp(prefix="bench-pg-"))
    as_user: list[str] = []
    if os.geteuid() == 0:
        shutil.chown(folder, "postgres", "postgres")
        as_user = ["runuser", "-u", "postgres", "--"]
    data = folder / "data"
    try:
        subprocess.run(
            [*as_user, str(programs / "initdb"), "-D", str(data), *INITDB_OPTIONS],
            check=True,
            capture_output=True,
        )
        port = _free_port()
        options = f"-h 127.0.0.1 -p {port} -k {folder} -c fsync=off -c full_page_writes=off"
        start = ["-l", str(folder / "log"), "-w", "-t", "60", "-o", options, "start"]
        subprocess.run(
            [*as_user, str(programs / "pg_ctl"), "-D", str(data), *start],
            check=True,
            capture_output=True,
        )
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return Cluster(folder, port, programs, as_user)


@contextmanager
def cluster() -> Iterator[Cluster]:
    """:func:`start_cluster`, stopped and removed on exit."""
    started = start_cluster()
    try:
        yield started
    finally:
        started.stop()
