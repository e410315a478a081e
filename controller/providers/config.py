"""Which model endpoint to use: the host config's ``[provider]`` table, with the environment
variables of :data:`ENV_NAMES` on top (a variable that is set wins over the table's key).

The API key is a :class:`pydantic.SecretStr`: ``repr``, ``str`` and ``model_dump`` show it
masked, validation errors never echo it, and it is read only where the request is made.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    StringConstraints,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from controller.errorinfo import Hint
from controller.errormap import describe_validation
from controller.errors import UsageError

ProviderApi = Literal["chat", "responses"]
"""``chat``: ``POST {base}/chat/completions``; ``responses``: ``POST {base}/responses``."""

DEFAULT_BASE_URL = "https://api.openai.com/v1"

ENV_NAMES = {
    "base_url": "OPENAI_BASE_URL",
    "api_key": "OPENAI_API_KEY",
    "model": "PATCHBOX_MODEL",
    "api": "PATCHBOX_PROVIDER_API",
    "stream": "PATCHBOX_PROVIDER_STREAM",
}
"""The environment variable read for each setting; a variable that is set and not empty wins
over the host config's key for the same setting (:meth:`ProviderConfig.from_mapping`)."""

_KEY_CHARS = re.compile(r"[\x21-\x7e]{1,4096}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
HostName = Annotated[
    str, StringConstraints(max_length=253, pattern=r"^[A-Za-z0-9:][A-Za-z0-9_.:-]{0,252}$")
]
"""A host name or an IP address, as a URL's host gives it."""

_INSECURE = "the API key is sent only over https"
_LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain"})


def _loopback(host: str) -> bool:
    if host.lower() in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class ProviderConfig(BaseModel):
    """An OpenAI-compatible endpoint and how patient to be with it."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, hide_input_in_errors=True, use_attribute_docstrings=True
    )

    api: ProviderApi = "chat"
    """Chat Completions or Responses."""
    base_url: Annotated[str, StringConstraints(min_length=1, max_length=2048)] = DEFAULT_BASE_URL
    """``http(s)://host[:port][/path]``, without credentials, query or fragment."""
    allow_insecure_http_hosts: list[HostName] = Field(default_factory=list, max_length=64)
    """Hosts the key may be sent to over plain ``http`` besides loopback: the operator's own
    model server on a private network (``host.docker.internal`` from a container). Names are
    compared without case; a name matches itself only (no wildcard, no subdomain)."""
    api_key: SecretStr | None = None
    """Sent as ``Authorization: Bearer``; None sends no Authorization header."""
    model: Annotated[str, StringConstraints(min_length=1, max_length=256)]
    """The model name the endpoint knows."""
    stream: bool = True
    """Ask for a server-sent event stream (``stream: true``)."""
    connect_timeout_seconds: float = Field(default=10.0, gt=0, le=300)
    read_timeout_seconds: float = Field(default=300.0, gt=0, le=3600)
    """The longest silence between two reads (a non-streamed answer is silent while the
    model thinks)."""
    request_deadline_seconds: float = Field(default=600.0, gt=0, le=7200)
    """The most one HTTP request may take from start to its last byte; not retried."""
    max_attempts: int = Field(default=4, ge=1, le=10)
    """Attempts per turn, counting the first; only transient failures are retried."""
    backoff_seconds: float = Field(default=1.0, ge=0, le=60)
    """The first wait before a retry; doubled each time up to ``max_backoff_seconds``."""
    max_backoff_seconds: float = Field(default=30.0, ge=0, le=600)
    max_retry_after_seconds: float = Field(default=60.0, ge=0, le=600)
    """A ``Retry-After`` up to this is honoured; a longer one ends the turn at once."""
    max_response_bytes: int = Field(default=16 * 1024 * 1024, ge=1024, le=64 * 1024 * 1024)
    """The largest answer read (an 8 MiB patch in tool arguments, escaped, fits)."""
    trust_env: bool = True
    """Honour ``HTTPS_PROXY``, ``NO_PROXY`` and ``SSL_CERT_FILE`` from the environment."""

    @field_validator("base_url")
    @classmethod
    def _base_url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https"):
            msg = "base_url must start with http:// or https://"
            raise ValueError(msg)
        if any(c.isspace() or not c.isprintable() for c in value):
            msg = "base_url must not contain spaces or control characters"
            raise ValueError(msg)
        if parts.username is not None or parts.password is not None:
            msg = "base_url must not contain credentials"
            raise ValueError(msg)
        if parts.query or parts.fragment or value.endswith(("?", "#")):
            msg = "base_url must not have a query or fragment"
            raise ValueError(msg)
        try:
            parts.port  # noqa: B018 - raises for a bad port
        except ValueError:
            msg = "base_url has an invalid port"
            raise ValueError(msg) from None
        if not parts.hostname:
            msg = "base_url has no host"
            raise ValueError(msg)
        return value.rstrip("/")

    @field_validator("api_key")
    @classmethod
    def _api_key(cls, value: SecretStr | None, info: ValidationInfo) -> SecretStr | None:
        if value is None:
            return None
        if not _KEY_CHARS.fullmatch(value.get_secret_value()):
            msg = "api_key must be 1 to 4096 printable ASCII characters without spaces"
            raise ValueError(msg)
        parts = urlsplit(info.data.get("base_url", ""))
        host = (parts.hostname or "").lower()
        allowed = {name.lower() for name in info.data.get("allow_insecure_http_hosts", [])}
        if parts.scheme == "http" and not _loopback(host) and host not in allowed:
            msg = (
                f"{_INSECURE} (plain http only to a loopback host or a host named in "
                "provider.allow_insecure_http_hosts)"
            )
            raise ValueError(msg)
        return value

    def public_view(self) -> dict[str, str]:
        """What may be shown of these settings: the API, the endpoint's scheme, host and
        port (never its path), the model, and whether a key is set (never the key)."""
        parts = urlsplit(self.base_url)
        endpoint = f"{parts.scheme}://{parts.netloc}"
        return {
            "api": self.api,
            "endpoint": endpoint,
            "model": self.model,
            "key": "set" if self.api_key is not None else "none",
        }

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ProviderConfig:
        """From the environment alone (no ``[provider]`` table): ``OPENAI_BASE_URL``,
        ``OPENAI_API_KEY``, ``PATCHBOX_MODEL``, ``PATCHBOX_PROVIDER_API`` and
        ``PATCHBOX_PROVIDER_STREAM`` (empty counts as unset); the same as
        ``from_mapping({}, environ)``.

        Raises :class:`UsageError` naming the variable that is missing or wrong.
        """
        return cls.from_mapping({}, environ)

    @classmethod
    def from_mapping(
        cls, table: Mapping[str, Any], environ: Mapping[str, str] | None = None
    ) -> ProviderConfig:
        """From the host config's ``[provider]`` table with the environment on top.

        The table holds the fields of this class, plus ``api_key_env`` naming the environment
        variable that holds the key when the table has no ``api_key`` (default
        ``OPENAI_API_KEY``). Each variable of :data:`ENV_NAMES` that is set and not empty
        wins over the table's key for the same setting; a setting given by neither keeps its
        default. ``OPENAI_API_KEY`` set together with an ``api_key_env`` that names another
        variable is a contradiction, not a precedence question: :class:`UsageError` naming
        both.

        Raises :class:`UsageError` for unknown keys, invalid values (naming the variable or
        the key the value came from), a missing model and the contradiction above.
        """
        env = os.environ if environ is None else environ
        values = dict(table)
        names = {field: f"provider.{field}" for field in cls.model_fields}
        env_name = values.pop("api_key_env", None)
        if env_name is not None and (
            not isinstance(env_name, str) or not _ENV_NAME.fullmatch(env_name)
        ):
            raise UsageError("provider.api_key_env must be an environment variable name")
        if "api_key" in values and env_name is not None:
            raise UsageError("provider: give api_key or api_key_env, not both")
        key_name = ENV_NAMES["api_key"]
        if env_name is not None and env_name != key_name:
            if env.get(key_name):
                raise UsageError(
                    f"{key_name} is set but the host config's provider.api_key_env names "
                    f"{env_name}: the key would come from two variables; unset {key_name} "
                    "or remove provider.api_key_env"
                )
            if env.get(env_name):
                values["api_key"] = env[env_name]
            names["api_key"] = env_name
        for field, name in ENV_NAMES.items():
            if env.get(name):
                values[field] = env[name]
                names[field] = name
        if "model" not in values:
            raise UsageError(
                f"no model configured: set {ENV_NAMES['model']} or the host config's provider.model"
            )
        return _build(values, names)


def _build(values: Mapping[str, Any], names: Mapping[str, str]) -> ProviderConfig:
    try:
        return ProviderConfig.model_validate(values)
    except ValidationError as exc:
        detail = describe_validation(exc, subject="provider", names=names, max_chars=10_000)
        insecure = any(_INSECURE in str(error.get("msg", "")) for error in exc.errors())
        hint = Hint(option="allow_insecure_http_hosts") if insecure else None
        raise UsageError(f"invalid provider settings: {detail}", hint=hint) from None
