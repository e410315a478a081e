"""The operator's host configuration: ``$PATCHBOX_HOME/config.toml`` or
``--config FILE``. Trusted; nothing in a repository under work can change it.

.. code-block:: toml

    allow_auto = false           # mode "auto" may apply when every gate holds
    allow_trusted_auto = false   # mode "trusted-auto" (also needs the request's consent)
    protected = ["secrets/**"]   # added to the built-in protected paths
    runtime = "runc"             # or "runsc"
    spare_sandboxes = 1          # spares kept for the next job on the same baseline
    spare_idle_seconds = 60      # an unclaimed spare ends after this long

    [limits]                     # defaults for tasks that do not say
    memory_mb = 1024

    ca_bundle = "/etc/ssl/certs/ca-certificates.crt"  # CAs for environment builds

    [environments.py]            # project environments tasks may name
    setup = [["python3", "-m", "pip", "install", "-r", "requirements-test.txt"]]
    inputs = ["requirements-test.txt"]

    [checks.tests]               # default checks for tasks that name none
    argv = ["python3", "-m", "pytest", "-q"]

    [network]                    # see controller.config.network
    allow = ["*.example.com:443"]

    [provenance]                 # the key that signs each decided job's attestations
    key = "/etc/patchbox/provenance.key"

    [provider]                   # see controller.providers.config
    api = "chat"
    base_url = "https://..."
    model = "..."
    api_key_env = "OPENAI_API_KEY"
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from controller.config.environment import EnvironmentName, EnvironmentSpec
from controller.config.limits import Limits
from controller.config.network import NetworkConfig
from controller.config.services import Capability
from controller.config.task import CheckId, CheckSpec
from controller.errormap import describe_validation
from controller.errors import UsageError
from controller.paths import patchbox_home


class ProvenanceConfig(BaseModel):
    """The ``[provenance]`` table."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key: str | None = Field(default=None, min_length=1, max_length=4096)
    """The private key (PEM, mode 0600) that signs every decided job's attestations; by
    default ``$PATCHBOX_HOME/keys/provenance.key`` when that file exists, else no job is
    signed."""


class HostConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    allow_auto: bool = False
    allow_trusted_auto: bool = False
    protected: list[str] = Field(default_factory=list, max_length=256)
    runtime: Literal["runc", "runsc"] = "runc"
    spare_sandboxes: int = Field(default=1, ge=0, le=16)
    spare_idle_seconds: float = Field(default=60.0, gt=0, le=86400)
    """An unclaimed spare ends after this long: short by default, so that a command's spare
    does not outlive it by much (``patchbox prune --spares`` removes them at once)."""
    attempt_concurrency: int = Field(default=2, ge=1, le=16)
    """How many attempts of ``run --attempts N`` run at once."""
    limits: Limits | None = None
    checks: dict[CheckId, CheckSpec] = Field(default_factory=dict)
    provider: dict[str, Any] = Field(default_factory=dict)
    environments: dict[EnvironmentName, EnvironmentSpec] = Field(default_factory=dict)
    service: dict[str, Any] = Field(default_factory=dict)
    """``patchbox serve``'s table (tenants, workers, database): validated by the service,
    ignored by every other command."""
    network: NetworkConfig = Field(default_factory=NetworkConfig)
    """What declared egress may reach (:mod:`controller.config.network`)."""
    service_capabilities: list[Capability] = Field(default_factory=list, max_length=64)
    """Capabilities a service container may keep (its ``cap_add``); empty (the default): a
    service keeps none."""
    provenance: ProvenanceConfig = Field(default_factory=ProvenanceConfig)
    ca_bundle: str | None = Field(default=None, max_length=4096)
    """PEM file of the CAs environment builds trust; by default the one the host's own
    TLS clients use (``PIP_CERT``, ``REQUESTS_CA_BUNDLE``, ``SSL_CERT_FILE``, ...); ``""``
    gives none."""


def load_config(path: Path | None = None) -> HostConfig:
    """The host configuration; defaults when the default file does not exist. A file named
    with ``--config`` must exist. Errors are ``UsageError`` naming the field, not the value."""
    explicit = path is not None
    target = path or patchbox_home() / "config.toml"
    try:
        raw = target.read_bytes()
    except FileNotFoundError as exc:
        if explicit:
            msg = f"the configuration file {str(target)!r} does not exist"
            raise UsageError(msg) from exc
        return HostConfig()
    except OSError as exc:
        msg = f"the configuration file {str(target)!r} cannot be read: {exc.strerror}"
        raise UsageError(msg) from exc
    try:
        data = tomllib.loads(raw.decode("utf-8"))
        return HostConfig.model_validate(data)
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        msg = f"the configuration file {str(target)!r} is not valid TOML"
        raise UsageError(msg) from exc
    except ValidationError as exc:
        fields = describe_validation(exc, subject="", model=HostConfig, syntax="toml")
        msg = f"the configuration file {str(target)!r} has invalid fields: {fields}"
        raise UsageError(msg) from exc
