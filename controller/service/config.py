"""The ``[service]`` table of the host configuration file.

The table lives in the same TOML file as the host configuration; it is taken out before the
rest is validated as :class:`controller.config.host.HostConfig` (which forbids unknown keys).

.. code-block:: toml

    [service]
    state = "sqlite"              # the only backend
    database = "/var/lib/patchbox/service.db"  # default: $PATCHBOX_HOME/service.db
    workers = 2
    data_dir = "/var/lib/patchbox/service-data"   # default: service-data beside the database
    bundle_max_bytes = 268435456  # the largest uploaded git bundle
    bundle_keep_seconds = 3600    # how long an uploaded bundle serves jobs, from its upload
    bundle_max_tree_bytes = 536870912   # the most bytes a bundle's HEAD checks out
    bundle_max_tree_entries = 100000    # the most files and folders it checks out
    header_timeout_seconds = 10   # a request's head must arrive complete within this
    metrics_token_sha256 = "<hex sha256 of the operator's metrics token>"  # optional

    [[service.tenants]]
    name = "alpha"
    token_sha256 = "<hex sha256 of the bearer token>"
    repo_roots = ["/srv/repos/alpha"]
    max_concurrent_jobs = 2
    max_sandboxes = 4
    max_queued_jobs = 10
    max_clones = 2
    allow_apply = true
    environments = ["py"]         # [environments.NAME] of the host configuration it may name
    allow_inline_environment = false
    inline_environment_bases = [] # bases an inline environment may name (none: the default)

    [service.tenants.max_limits]  # the most its tasks may ask for (default: the defaults)
    memory_mb = 2048
    wall_seconds = 1800
"""

from __future__ import annotations

import contextlib
import re
import tomllib
from pathlib import Path
from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from controller.config.environment import EnvironmentName
from controller.config.fields import ImageRef
from controller.config.host import HostConfig, ProvenanceConfig
from controller.config.network import EgressPattern
from controller.errormap import describe_validation
from controller.errors import PatchboxError, UsageError
from controller.paths import patchbox_home
from controller.provenance.keys import init_key, load_signer


class LimitCaps(BaseModel):
    """The most a tenant's task may ask for: each of the task's ``limits``, each check's
    ``timeout_seconds`` (``check_seconds``), the number of its checks, and an inline
    environment's build. The defaults are the task's own defaults, so a task that does not
    say passes; a task over a cap is refused (``TASK_NOT_ALLOWED``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    memory_mb: int = Field(default=1024, ge=64, le=65536)
    cpus: float = Field(default=1.0, gt=0.0, le=64.0)
    pids: int = Field(default=256, ge=16, le=32768)
    workspace_mb: int = Field(default=512, ge=1, le=65536)
    tmp_mb: int = Field(default=64, ge=1, le=4096)
    wall_seconds: float = Field(default=900.0, gt=0.0, le=86400.0)
    check_seconds: float = Field(default=300.0, gt=0.0, le=86400.0)
    """The task's ``limits.check_seconds`` and every check's ``timeout_seconds``."""
    max_turns: int = Field(default=50, ge=1, le=10000)
    max_tool_calls: int = Field(default=200, ge=1, le=100000)
    checks: int = Field(default=16, ge=0, le=1024)
    """How many checks a task may define."""
    setup_memory_mb: int = Field(default=4096, ge=128, le=65536)
    """An inline environment's ``setup_memory_mb``."""
    setup_timeout_seconds: float = Field(default=1800.0, gt=0, le=6 * 3600)
    """An inline environment's ``setup_timeout_seconds``."""


class TenantConfig(BaseModel):
    """One tenant: who it is (its token's SHA-256), where its repositories are, its quotas,
    and what its tasks may ask for (:mod:`controller.service.policy`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    token_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    repo_roots: list[str] = Field(min_length=1, max_length=256)
    max_concurrent_jobs: int = Field(default=1, ge=1, le=256)
    max_queued_jobs: int = Field(default=10, ge=1, le=100_000)
    max_sandboxes: int | None = Field(default=None, ge=1, le=1024)
    """The most sandbox containers the tenant's jobs hold at once. A running job holds one
    (its tools' sandbox, then its checks' fresh one); with this set, the tenant's jobs start
    no spare sandbox (a spare outlives its job), so at most this many of its jobs run."""

    max_clones: int = Field(default=2, ge=1, le=256)
    """The most bundle jobs of the tenant holding a checked-out clone at once (a bundle job
    checks its bundle out when it starts and removes the clone when it ends); another one
    waits queued."""

    def job_limit(self) -> int:
        """How many of the tenant's jobs may run at once."""
        if self.max_sandboxes is None:
            return self.max_concurrent_jobs
        return min(self.max_concurrent_jobs, self.max_sandboxes)

    allow_apply: bool = False
    environments: list[EnvironmentName] = Field(default_factory=list, max_length=256)
    """The host configuration's ``[environments.NAME]`` the tenant's tasks may name."""
    allow_inline_environment: bool = False
    """Whether a task may give its own environment block (setup steps run as root, with
    network, on the service's Docker host)."""
    inline_environment_bases: list[ImageRef] = Field(default_factory=list, max_length=256)
    """The images an inline environment may name as its ``base`` (without one it gets the
    default sandbox base)."""
    max_limits: LimitCaps = Field(default_factory=LimitCaps)
    egress_allow: list[EgressPattern] = Field(default_factory=list, max_length=1024)
    """The ``host:port`` patterns the tenant's checks may declare as ``egress`` (within the
    host configuration's ``network.allow`` too); empty (the default): none."""


class ServiceConfig(BaseModel):
    """The service's own settings and its tenants."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    state: Literal["sqlite", "postgres"] = "sqlite"
    """Where the service keeps its jobs, events and bundles' metadata: an embedded SQLite
    file, or a PostgreSQL database several ``patchbox serve`` processes can share."""
    database: str | None = Field(default=None, max_length=4096)
    """The SQLite file (default ``$PATCHBOX_HOME/service.db``), or with ``state =
    "postgres"`` the database's URL (``postgresql://USER@HOST:PORT/NAME``; required)."""
    workers: int = Field(default=2, ge=0, le=64)
    """Jobs run at once across all tenants; 0 accepts and queues jobs but runs none."""
    lease_seconds: float = Field(default=30.0, ge=3, le=600)
    """How long a replica's claim on a running job holds without being renewed (it is
    renewed every third of it): past it, another replica on the same database ends the job
    ``INTERRUPTED`` and runs the queue, and the replica itself stops the job."""
    visible_roots: list[str] | None = Field(default=None, max_length=256)
    """The repository roots this process can see (absolute paths): it claims only jobs on a
    repository under one of them (and jobs on uploaded bundles). Default: the tenants'
    ``repo_roots`` that are folders on its host."""
    tenants: list[TenantConfig] = Field(default_factory=list, max_length=10_000)
    data_dir: str | None = Field(default=None, max_length=4096)
    """The service's own folder: uploaded bundles and the clones bundle jobs run on, one
    sub-folder per tenant (default ``service-data`` beside the database)."""
    signing_key: str | None = Field(default=None, min_length=1, max_length=4096)
    """The service's own key that signs its jobs' attestations (default
    ``service-provenance.key`` beside the database, made at the first start)."""
    bundle_max_bytes: int = Field(default=256 * 1024 * 1024, ge=1024, le=1 << 40)
    """The largest git bundle ``POST /v1/bundles`` takes (413 ``BUNDLE_TOO_LARGE`` over it)."""
    bundle_keep_seconds: float = Field(default=3600.0, gt=0, le=30 * 86400)
    """How long an uploaded bundle is kept for the tenant's jobs, from its upload (longer
    while a queued or running job of the tenant needs it)."""
    bundle_max_tree_bytes: int = Field(default=512 * 1024 * 1024, ge=1, le=1 << 40)
    """The most bytes of files a bundle's HEAD may hold (the sizes of its blobs, as they are
    checked out: no ``.gitattributes`` conversion applies); 413 ``BUNDLE_TREE_TOO_LARGE``
    at upload, and a job whose bundle is over it when it starts ends ``failed`` with it."""
    bundle_max_tree_entries: int = Field(default=100_000, ge=1, le=10_000_000)
    """The most entries (files, folders, symbolic links, submodules) a bundle's HEAD may
    hold, counted the same way."""
    header_timeout_seconds: float = Field(default=10.0, gt=0, le=300)
    """How long a client may take to send a request's head (request line and headers), from
    its connection or the end of its previous answer; the connection is closed after it."""
    metrics_token_sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    """The hex SHA-256 of the operator's bearer token for ``GET /metrics``: with it the
    metrics name each tenant; without a token they are totals only."""

    @model_validator(mode="after")
    def _unique(self) -> Self:
        if any(not root.startswith("/") for root in self.visible_roots or []):
            raise ValueError("visible_roots must be absolute paths")
        names = [t.name for t in self.tenants]
        if len(set(names)) != len(names):
            raise ValueError("tenant names must be unique")
        hashes = [t.token_sha256 for t in self.tenants]
        if len(set(hashes)) != len(hashes):
            raise ValueError("two tenants have the same token_sha256")
        if self.metrics_token_sha256 in hashes:
            raise ValueError("metrics_token_sha256 is a tenant's token_sha256")
        if self.state == "postgres" and not (self.database or "").startswith(POSTGRES_URLS):
            raise ValueError('state "postgres" needs database = "postgresql://..."')
        return self

    def database_path(self) -> Path:
        """The SQLite file (``state = "sqlite"``)."""
        return Path(self.database) if self.database else patchbox_home() / "service.db"

    def state_folder(self) -> Path:
        """Where the service's own files go by default: beside the SQLite file, or
        ``$PATCHBOX_HOME`` with PostgreSQL."""
        return patchbox_home() if self.state == "postgres" else self.database_path().parent

    def store_name(self) -> str:
        """The store as the startup summary names it: the file, or the database's URL
        without a password."""
        if self.state != "postgres":
            return str(self.database_path())
        return re.sub(r"(://[^:/@]*):[^@/]*@", r"\1:***@", self.database or "")

    def signing_key_path(self) -> Path:
        """The service's signing key (:attr:`signing_key`)."""
        if self.signing_key:
            return Path(self.signing_key).expanduser()
        return self.state_folder() / "service-provenance.key"

    def data_path(self) -> Path:
        """The service's own folder (bundles and their clones)."""
        if self.data_dir:
            return Path(self.data_dir)
        return self.state_folder() / "service-data"


POSTGRES_URLS = ("postgresql://", "postgres://")


def load_service_config(path: Path | None = None) -> tuple[HostConfig, ServiceConfig]:
    """The host configuration and the service table of ``path`` (default
    ``$PATCHBOX_HOME/config.toml``; a missing default file gives defaults and no tenant).
    Errors are ``UsageError`` naming the field, not the value."""
    target = path or patchbox_home() / "config.toml"
    try:
        raw = target.read_bytes()
    except FileNotFoundError as exc:
        if path is not None:
            msg = f"the configuration file {str(target)!r} given with --config does not exist"
            raise UsageError(msg) from exc
        return HostConfig(), ServiceConfig()
    except OSError as exc:
        msg = f"the configuration file {str(target)!r} cannot be read: {exc.strerror}"
        raise UsageError(msg) from exc
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        msg = f"the configuration file {str(target)!r} is not valid TOML"
        raise UsageError(msg) from exc
    table = data.pop("service", {})
    try:
        host = HostConfig.model_validate(data)
    except ValidationError as exc:
        fields = describe_validation(exc, subject="", model=HostConfig, syntax="toml")
        msg = f"the configuration file {str(target)!r} has invalid fields: {fields}"
        raise UsageError(msg) from exc
    try:
        service = ServiceConfig.model_validate(table)
    except ValidationError as exc:
        fields = describe_validation(exc, subject="service", model=ServiceConfig, syntax="toml")
        msg = f"the configuration file {str(target)!r} has invalid [service] fields: {fields}"
        raise UsageError(msg) from exc
    for tenant in service.tenants:
        unknown = sorted(set(tenant.environments) - set(host.environments))
        if unknown:
            msg = (
                f"the configuration file {str(target)!r}: tenant {tenant.name!r} lists "
                f"environments the host configuration does not define: {', '.join(unknown)}"
            )
            raise UsageError(msg)
    return host, service


def with_service_key(host: HostConfig, config: ServiceConfig) -> HostConfig:
    """``host`` signing with the service's own key (:meth:`ServiceConfig.signing_key_path`),
    made at the first start when the default one does not exist yet."""
    path = config.signing_key_path()
    if config.signing_key is None and not path.exists():
        with contextlib.suppress(PatchboxError):  # another replica made it first: its key
            init_key(path)
    load_signer(path)  # a key that cannot sign stops the start, not every job
    return host.model_copy(update={"provenance": ProvenanceConfig(key=str(path))})
