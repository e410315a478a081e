"""Services beside a job's checks: a database, a cache, a broker, each in a container of its
own on a per-job internal network that reaches nothing else. Declared in an environment
(``services``), reached by a check by name (``db:5432``); trusted configuration, validated
strictly.

.. code-block:: toml

    [environments.app.services.db]
    build = { setup = [["apt-get", "install", "-y", "postgresql"]] }
    user = "postgres"
    command = ["/usr/lib/postgresql/15/bin/postgres", "-D", "/tmp/pg"]
    ready = { argv = ["pg_isready", "-h", "127.0.0.1"], timeout_seconds = 60 }
"""

from __future__ import annotations

import re
from typing import Annotated, Self

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from controller.config.fields import ImageRef, check_env_names

ServiceName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")]
"""A service's name, as a check's id is written; also its host name on the job's network
(names resolve there whatever their case)."""
MAX_SERVICES = 8
Arg = Annotated[str, StringConstraints(min_length=1, max_length=4096)]
Argv = Annotated[list[Arg], Field(min_length=1, max_length=256)]
Capability = Annotated[str, StringConstraints(pattern=r"^[A-Z][A-Z_]{1,31}$")]
"""A Linux capability without its ``CAP_`` prefix (``CHOWN``, ``SETUID``)."""
_ID = r"(?:[a-z_][a-z0-9_-]{0,31}|[0-9]{1,10})"
_USER = re.compile(rf"^{_ID}(?::{_ID})?$")
_ROOTS = frozenset({"root", "0"})
_TMPFS = re.compile(r"^/[A-Za-z0-9._/-]{1,255}$")
_NOT_TMPFS = ("/proc", "/sys", "/dev", "/etc")


class ServiceReady(BaseModel):
    """When the service is ready: ``argv`` (run inside the service's container) succeeds."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    argv: Argv
    timeout_seconds: float = Field(default=60.0, gt=0, le=900)
    """How long the service has to become ready, from its start."""


class ServiceLimits(BaseModel):
    """The service container's cgroup limits."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    memory_mb: int = Field(default=512, ge=32, le=65536)
    cpus: float = Field(default=1.0, gt=0, le=64)
    pids: int = Field(default=256, ge=8, le=32768)
    tmpfs_mb: int = Field(default=256, ge=1, le=65536)
    """The size of each of its writable folders (``tmpfs``)."""


class ServiceBuild(BaseModel):
    """A service image made as an environment image is: a base and setup steps, run as
    root once, reaching the environment's setup egress, cached by a key of both."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    base: ImageRef | None = None
    """The base image; by default the default sandbox base."""
    setup: list[Argv] = Field(min_length=1, max_length=32)


class ServiceSpec(BaseModel):
    """One service: its image (``image``, a reference, or ``build``), its variables, its
    command, when it is ready, and its limits. Unknown fields are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    image: ImageRef | None = None
    build: ServiceBuild | None = None
    env: dict[str, Annotated[str, StringConstraints(max_length=4096)]] = Field(
        default_factory=dict, max_length=64
    )
    command: Argv | None = None
    """What the container runs; by default the image's own command."""
    user: Annotated[str, StringConstraints(min_length=1, max_length=65)] | None = None
    """Who it runs as (a name or uid of the image, ``[:group]``); by default the image's
    user. Never root: a service that needs root is refused."""
    ready: ServiceReady
    limits: ServiceLimits = Field(default_factory=ServiceLimits)
    tmpfs: list[Annotated[str, StringConstraints(min_length=2, max_length=256)]] = Field(
        default_factory=list, max_length=16
    )
    """Writable folders (the service's data), each a fresh tmpfs; ``/tmp`` always is one.
    The rest of its file system is read-only."""
    cap_add: list[Capability] = Field(default_factory=list, max_length=16)
    """Capabilities it keeps (every other is dropped): only those the host configuration's
    ``service_capabilities`` allows."""

    @model_validator(mode="after")
    def _valid(self) -> Self:
        if (self.image is None) == (self.build is None):
            msg = "a service needs exactly one of image and build"
            raise ValueError(msg)
        check_env_names(self.env)
        if self.build is not None and (self.command is None or self.user is None):
            msg = "a service made by build needs its command and its user"
            raise ValueError(msg)
        if self.user is not None:
            if not _USER.match(self.user):
                msg = f"user {self.user[:65]!r} is not a user name or id (with an optional group)"
                raise ValueError(msg)
            if self.user.split(":", 1)[0] in _ROOTS:
                msg = "a service does not run as root; name the user its software runs as"
                raise ValueError(msg)
        for path in self.tmpfs:
            _check_tmpfs(path)
        for argv in [self.command or [], self.ready.argv]:
            if any("\x00" in a for a in argv):
                msg = "a service's command contains NUL"
                raise ValueError(msg)
        return self


def _check_tmpfs(path: str) -> None:
    """A service's writable folder: an absolute path, not over the system's own folders."""
    if not _TMPFS.match(path) or ".." in path.split("/") or path.rstrip("/") == "":
        msg = f"tmpfs {path[:256]!r} must be an absolute folder path"
        raise ValueError(msg)
    if any(path == p or path.startswith(p + "/") for p in _NOT_TMPFS):
        msg = f"tmpfs {path[:256]!r} may not cover {path.split('/')[1]!r}"
        raise ValueError(msg)
