"""A replica's own Docker engine and what it can see, as its heartbeat finds them.

Each ``patchbox serve`` process runs its jobs on one Docker engine (its ``DOCKER_HOST``, or
the local socket). The heartbeat asks that engine for a ping: while it does not answer, the
replica claims no job, and the jobs it runs end ``failed`` with ``INTERRUPTED`` and a
message naming the engine; once it answers again, what those jobs left on it is removed and
claiming resumes. A replica serves the jobs whose repository is under the roots it can see
(``[service] visible_roots``, or else its tenants' ``repo_roots`` that are folders on its
host) and jobs on uploaded bundles (their clones are made where the job runs)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import docker
import docker.errors

from controller.errorinfo import ErrorInfo
from controller.errors import ErrorCode

if TYPE_CHECKING:
    from controller.jobs.engine import Job
    from controller.service.config import ServiceConfig

ENGINE_CODES = frozenset(
    {ErrorCode.ENVIRONMENT_NOT_READY, ErrorCode.SANDBOX_FAILED, ErrorCode.INTERNAL_ERROR}
)
"""The codes a job that could not start fails with when its engine is the cause."""
PING_SECONDS = 3.0
"""How long the heartbeat waits for the engine's answer to a ping."""
LOCAL_ENGINE = "unix:///var/run/docker.sock"


def engine_name() -> str:
    """The engine this process's jobs run on, as ``DOCKER_HOST`` names it."""
    return os.environ.get("DOCKER_HOST") or LOCAL_ENGINE


def ping_engine() -> bool:
    """Whether the engine answers a ping within :data:`PING_SECONDS`."""
    try:
        client = docker.from_env(timeout=int(PING_SECONDS))
    except docker.errors.DockerException:
        return False
    try:
        return bool(client.ping())
    except Exception:
        return False
    finally:
        client.close()


def answers(connect: Callable[[], docker.DockerClient]) -> Callable[[], bool]:
    """A ping through ``connect`` (a client made and closed): whether it answers."""

    def ping() -> bool:
        try:
            connect().close()
        except Exception:
            return False
        return True

    return ping


def engine_lost(name: str) -> str:
    """The error message of a job its replica's engine stopped answering for."""
    return f"interrupted: the Docker engine {name} stopped answering"


@dataclass
class EngineWatch:
    """Whether the replica's engine answers, from the heartbeat's last ping."""

    name: str
    ping: Callable[[], bool]
    down: bool = False

    def look(self) -> str | None:
        """Pings the engine: ``"lost"`` when it stopped answering since the last look,
        ``"back"`` when it answers again, None when nothing changed."""
        answers = self.ping()
        if answers == (not self.down):
            return None
        self.down = not answers
        return "back" if answers else "lost"

    def lost(self) -> str:
        return engine_lost(self.name)


def can_see(roots: Iterable[str], repo: str) -> bool:
    """Whether ``repo`` is one of ``roots`` or under one (as written or with its links
    resolved), by its path's parts."""
    parts = Path(repo).parts
    for root in roots:
        for form in {Path(root).parts, Path(os.path.realpath(root)).parts}:
            if parts[: len(form)] == form:
                return True
    return False


def roots_of(service: ServiceConfig) -> tuple[str, ...]:
    """The repository roots the replica with ``service`` serves (:func:`seen_roots`)."""
    roots = (root for tenant in service.tenants for root in tenant.repo_roots)
    return seen_roots(service.visible_roots, roots)


def seen_roots(visible: list[str] | None, tenant_roots: Iterable[str]) -> tuple[str, ...]:
    """The repository roots a replica serves: ``visible`` as configured, or else the
    tenants' roots that are folders on this host now."""
    if visible is not None:
        return tuple(visible)
    return tuple(sorted({r for r in tenant_roots if Path(r).is_dir()}))


def blame_engine(job: Job, engine: EngineWatch) -> bool:
    """A job that failed while its engine stopped answering (a lost connection, a
    container gone with its engine) ends ``INTERRUPTED`` naming the engine; the error the
    step saw is kept in its diagnostics (``engine_error``). Whether it did."""
    record, error = job.record, job.record.error
    if record.state != "failed" or error is None:
        return False
    if error.code in {ErrorCode.INTERRUPTED, ErrorCode.CANCELLED}:
        return error.message == engine.lost()
    if not engine.down and engine.ping():
        return False
    record.diagnostics["engine_error"] = error.model_dump()
    record.error = ErrorInfo(code=str(ErrorCode.INTERRUPTED), message=engine.lost())
    job.store.save(record)
    return True
