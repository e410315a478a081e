"""The job's proxy as its checks see it.

A job whose checks declare ``egress`` has one proxy (:class:`controller.sandbox.egress.
EgressProxy`) and its sandboxes sit on the proxy's internal network. Between checks the
proxy allows nothing; while a check runs it allows exactly that check's pairs (one check runs
at a time in a sandbox, and the job's sandboxes run one after the other). Every request a
check made is its record: :meth:`NetworkGate.close` gives them once the check ended.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable, Iterator, Mapping
from typing import Protocol

from controller.config.network import EgressRule
from controller.sandbox.egress import Connection, EgressProxy


class NetworkGate:
    """One job's proxy, opened for one check at a time."""

    def __init__(self, proxy: EgressProxy, rules: Mapping[str, tuple[EgressRule, ...]]) -> None:
        self.proxy = proxy
        self.rules = dict(rules)
        self._lock = threading.Lock()
        self._open: str | None = None

    def environment(self) -> dict[str, str]:
        """The proxy variables every process in the job's sandboxes gets."""
        return self.proxy.environment()

    def open(self, check_id: str) -> None:
        """Lets ``check_id``'s pairs through (and nothing else) until :meth:`close`."""
        with self._lock:
            self.proxy.connections()  # what came before is no check's: dropped
            self.proxy.allow(self.rules.get(check_id, ()))
            self._open = check_id

    def close(self) -> list[Connection]:
        """Allows nothing again; the requests made since :meth:`open`."""
        with self._lock:
            if self._open is None:
                return []
            self._open = None
            self.proxy.allow(())
            return self.proxy.connections()

    @contextlib.contextmanager
    def during(self, check_id: str) -> Iterator[list[Connection]]:
        """Open for ``check_id`` in the block; the list holds its requests after it."""
        seen: list[Connection] = []
        self.open(check_id)
        try:
            yield seen
        finally:
            seen.extend(self.close())


def checked(
    gate: NetworkGate | None, check_id: str
) -> contextlib.AbstractContextManager[list[Connection]]:
    """:meth:`NetworkGate.during` of ``gate``, or (no gate) a block that records nothing."""
    if gate is None:
        return contextlib.nullcontext([])
    return gate.during(check_id)


class Request(Protocol):
    """A request as a check's result or record keeps it."""

    @property
    def host(self) -> str: ...
    @property
    def port(self) -> int: ...
    @property
    def allowed(self) -> bool: ...
    @property
    def reason(self) -> str | None: ...


def refused_text(connections: Iterable[Request]) -> str:
    """The pairs the proxy refused, in words (empty when none was): what to add to the
    check's ``egress`` (or why it cannot be)."""
    refused: dict[str, str] = {}
    for c in connections:
        if not c.allowed:
            refused.setdefault(f"{c.host}:{c.port}", c.reason or "")
    words = {
        "not_allowed": "not in the check's egress",
        "inward": "resolves to a private or local address",
        "unresolved": "does not resolve",
    }
    return ", ".join(f"{pair} ({words.get(why, 'refused')})" for pair, why in refused.items())
