"""A throwaway PostgreSQL cluster for the tests: Debian's server programs, a cluster made in
a temporary folder (run as the ``postgres`` user when the tests run as root: the server
refuses root), listening on a free loopback port, removed at the end. Each test gets a
database of its own (:meth:`Cluster.database`). Without the server programs the tests that
need it are skipped, or fail under CI (``CI=true``) or ``PATCHBOX_REQUIRE_POSTGRES=1``."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

import psycopg

USER = "patchbox"


def server_bin() -> Path | None:
    """The folder of Debian's PostgreSQL server programs (the newest version), or None."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))
    return found[-1].parent if found else None


def required() -> bool:
    return (
        os.environ.get("CI", "").lower() == "true"
        or os.environ.get("PATCHBOX_REQUIRE_POSTGRES") == "1"
    )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Cluster:
    folder: Path
    port: int
    bin: Path
    as_user: list[str]

    @property
    def admin_dsn(self) -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/postgres"

    def database(self) -> str:
        """A new empty database; its DSN."""
        name = "t_" + uuid.uuid4().hex[:12]
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}".encode())
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        subprocess.run(
            [
                *self.as_user,
                str(self.bin / "pg_ctl"),
                "-D",
                str(self.folder / "data"),
                "-m",
                "immediate",
                "stop",
            ],
            capture_output=True,
            check=False,
        )
        shutil.rmtree(self.folder, ignore_errors=True)


def start_cluster(folder: Path) -> Cluster:
    """Makes and starts a cluster in ``folder`` (trust authentication on loopback only,
    no fsync: a test database, thrown away)."""
    programs = server_bin()
    if programs is None:
        msg = "PostgreSQL's server programs are not installed (Debian's postgresql package)"
        raise FileNotFoundError(msg)
    folder.mkdir(parents=True, exist_ok=True)
    as_user: list[str] = []
    if os.geteuid() == 0:
        shutil.chown(folder, "postgres", "postgres")
        as_user = ["runuser", "-u", "postgres", "--"]
    data = folder / "data"
    subprocess.run(
        [
            *as_user,
            str(programs / "initdb"),
            "-D",
            str(data),
            "-A",
            "trust",
            "-U",
            USER,
            "--no-sync",
            "-E",
            "UTF8",
        ],
        check=True,
        capture_output=True,
    )
    port = _free_port()
    options = f"-h 127.0.0.1 -p {port} -k {folder} -c fsync=off -c full_page_writes=off"
    subprocess.run(
        [
            *as_user,
            str(programs / "pg_ctl"),
            "-D",
            str(data),
            "-l",
            str(folder / "log"),
            "-w",
            "-t",
            "60",
            "-o",
            options,
            "start",
        ],
        check=True,
        capture_output=True,
    )
    return Cluster(folder, port, programs, as_user)
