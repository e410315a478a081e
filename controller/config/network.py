"""Declared network: which ``host:port`` pairs a check may reach
through the job's proxy, and the operator's say over them.

A task declares ``egress`` on a check (``checks.ID.egress``) and on an environment's setup
(``environment.egress``): a list of ``host:port`` entries, each an exact name
(``api.example.com:443``) or one leading ``*.`` label (``*.example.com:443``: any name that
ends ``.example.com``, not ``example.com`` itself), the port always given; or
``preset:NAME``, one of the operator's named lists. With no ``egress`` the sandbox has no
network at all.

The operator owns the network: the host configuration's ``[network]`` table says which
patterns any task may use (``allow``), the named lists (``presets``), which Docker network
the proxy reaches out on (``outside``) and which runtime runs a gVisor sandbox that has a network
(``runsc_runtime``), and the egress of setup steps whose environment gives none
(``setup_default``). An entry the operator does not allow is refused before anything starts
(``EGRESS_NOT_ALLOWED``, naming it).

.. code-block:: toml

    [network]
    allow = ["*.example.com:443", "files.example.org:443"]

    [network.presets]
    packages = ["index.example.net:443", "files.example.net:443"]
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Annotated, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    model_validator,
)

from controller.errors import EgressNotAllowedError, UsageError

MAX_ENTRIES = 64
"""Entries of one ``egress`` list (and of ``allow``, of a preset)."""
PRESET_PREFIX = "preset:"
_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
_NAME = re.compile(rf"^(?:\*\.)?{_LABEL}(?:\.{_LABEL})+$")
_PRESET_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")


@dataclass(frozen=True, order=True)
class EgressRule:
    """One allowed pair: an exact lower-case name or ``*.`` + a name, and a port."""

    host: str
    port: int

    def text(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def wildcard(self) -> bool:
        return self.host.startswith("*.")

    def covers(self, other: EgressRule) -> bool:
        """Whether every request ``other`` allows is one this rule allows too."""
        if self.port != other.port:
            return False
        if not self.wildcard:
            return self.host == other.host
        suffix = self.host[1:]  # ".example.com"
        return other.host.endswith(suffix) and other.host != suffix[1:]

    def matches(self, host: str, port: int) -> bool:
        """Whether a request to ``host:port`` (a name, any case, a trailing dot) is allowed."""
        name = host.lower().rstrip(".")
        return self.covers(EgressRule(name, port)) if _NAME.match(name) else False


def parse_rule(text: str) -> EgressRule:
    """``host:port`` as a rule; ``ValueError`` saying what is wrong with it."""
    if not isinstance(text, str) or not text:
        msg = "an egress entry is a non-empty 'host:port' string"
        raise ValueError(msg)
    if len(text) > 300 or any(ord(c) < 0x21 or ord(c) > 0x7E for c in text):
        msg = f"egress entry {text[:80]!r}: printable ASCII without spaces, at most 300 characters"
        raise ValueError(msg)
    host, sep, port_text = text.rpartition(":")
    if not sep or not host:
        msg = f"egress entry {text!r}: the port must be given ('host:port')"
        raise ValueError(msg)
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535 or port_text.startswith("0"):
        msg = f"egress entry {text!r}: the port must be a number from 1 to 65535"
        raise ValueError(msg)
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        pass
    else:
        msg = f"egress entry {text!r}: name a host, not an address (the proxy resolves names)"
        raise ValueError(msg)
    if host != host.lower():
        msg = f"egress entry {text!r}: write the name in lower case"
        raise ValueError(msg)
    if len(host) > 253 or not _NAME.match(host):
        msg = (
            f"egress entry {text!r}: the host must be a DNS name of at least two labels, "
            "exact or with one leading '*.' label"
        )
        raise ValueError(msg)
    return EgressRule(host, int(port_text))


def _check_entry(text: str) -> str:
    if text.startswith(PRESET_PREFIX):
        name = text[len(PRESET_PREFIX) :]
        if not _PRESET_NAME.match(name):
            msg = f"egress entry {text[:80]!r}: a preset is named with a-z, 0-9, - and _"
            raise ValueError(msg)
        return text
    parse_rule(text)
    return text


def _check_pattern(text: str) -> str:
    parse_rule(text)
    return text


def _check_preset_name(text: str) -> str:
    if not _PRESET_NAME.match(text):
        msg = f"preset name {text[:80]!r}: lower-case letters, digits, - and _"
        raise ValueError(msg)
    return text


EgressEntry = Annotated[str, AfterValidator(_check_entry)]
"""``host:port`` or ``preset:NAME``, as a task writes it."""
EgressPattern = Annotated[str, AfterValidator(_check_pattern)]
"""``host:port`` only, as the operator's ``allow`` and presets write it."""
EgressList = Annotated[list[EgressEntry], Field(max_length=MAX_ENTRIES)]
PresetName = Annotated[str, AfterValidator(_check_preset_name)]


class NetworkConfig(BaseModel):
    """The host configuration's ``[network]`` table (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    allow: list[EgressPattern] = Field(default_factory=list, max_length=1024)
    """The patterns any task may use; empty (the default): no task may declare egress."""
    presets: dict[PresetName, Annotated[list[EgressPattern], Field(max_length=MAX_ENTRIES)]] = (
        Field(default_factory=dict, max_length=64)
    )
    setup_default: EgressList = Field(default_factory=list)
    """The ``egress`` of an environment's setup steps when the environment does not give
    one (entries as a task writes them, ``preset:NAME`` included); empty (the default): such
    setup steps have no network at all."""
    outside: Annotated[str, StringConstraints(min_length=1, max_length=128)] = "bridge"
    """The Docker network the proxy reaches out on."""
    runsc_runtime: Annotated[str, StringConstraints(min_length=1, max_length=128)] = "runsc-egress"
    """The Docker runtime that runs a gVisor sandbox with a declared egress: gVisor with
    ``--network=host`` (its socket calls go to the sandbox's own network namespace, which
    reaches only the proxy); the ``runsc`` runtime has no network at all."""

    @model_validator(mode="after")
    def _presets_defined(self) -> Self:
        try:
            expand(self.setup_default, self)
        except UsageError as exc:
            msg = "setup_default: " + exc.message
            raise ValueError(msg) from None
        return self


def setup_rules(
    egress: Sequence[str] | None,
    network: NetworkConfig,
    *,
    allow: Sequence[str] | None = None,
) -> tuple[EgressRule, ...]:
    """The rules an environment's setup steps may reach: its own ``egress`` (each entry
    allowed by ``network.allow`` and, when given, ``allow``, else ``EGRESS_NOT_ALLOWED``) or,
    when it gives none, the operator's ``setup_default`` (the operator's own list, not held
    to ``allow``)."""
    if egress is None:
        return tuple(rule for _entry, rule in expand(network.setup_default, network))
    return permitted(egress, network, allow=allow, where="environment.egress")


def expand(entries: Iterable[str], network: NetworkConfig) -> list[tuple[str, EgressRule]]:
    """Each entry's rules, presets expanded, with the entry each came from (in order, without
    repeats); ``UsageError`` for a preset the configuration does not define."""
    found: list[tuple[str, EgressRule]] = []
    seen: set[EgressRule] = set()
    for entry in entries:
        if entry.startswith(PRESET_PREFIX):
            name = entry[len(PRESET_PREFIX) :]
            if name not in network.presets:
                known = ", ".join(sorted(network.presets)) or "none"
                msg = (
                    f"egress entry {entry!r} names a preset the host configuration does not "
                    f"define (defined: {known})"
                )
                raise UsageError(msg)
            rules = [parse_rule(p) for p in network.presets[name]]
        else:
            rules = [parse_rule(entry)]
        for rule in rules:
            if rule not in seen:
                seen.add(rule)
                found.append((entry, rule))
    return found


def permitted(
    entries: Sequence[str],
    network: NetworkConfig,
    *,
    allow: Sequence[str] | None = None,
    where: str = "egress",
) -> tuple[EgressRule, ...]:
    """The rules of ``entries``, each covered by a pattern of the operator's ``allow`` (and,
    when given, of ``allow``, a tenant's own list); ``EGRESS_NOT_ALLOWED`` naming every entry
    that is not, and ``where`` it was declared."""
    rules = expand(entries, network)
    allowed = [parse_rule(p) for p in network.allow]
    narrower = None if allow is None else [parse_rule(p) for p in allow]
    refused: list[str] = []
    for entry, rule in rules:
        ok = any(a.covers(rule) for a in allowed)
        if ok and narrower is not None:
            ok = any(a.covers(rule) for a in narrower)
        if not ok:
            named = rule.text() if entry == rule.text() else f"{rule.text()} (from {entry})"
            refused.append(named)
    if refused:
        bound = "the host configuration's network.allow"
        if allow is not None:
            bound += " and the tenant's egress_allow"
        msg = f"{where} declares what {bound} does not allow: {', '.join(refused)}"
        raise EgressNotAllowedError(msg[:2000])
    return tuple(rule for _entry, rule in rules)
