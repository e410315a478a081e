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


class CheckServices(Protocol):
    """A job's services (:class:`controller.jobs.services.JobServices`) as its checks see
    them."""

    def ensure(self, check_id: str) -> None:
        """``check_id``'s services, started and ready (``SERVICE_NOT_READY``)."""

    def renew(self) -> None:
        """Fresh services for the fresh check sandbox."""

    def close(self) -> None:
        """Every service and their network removed."""


class NetworkGate:
    """One job's network as its checks see it: its proxy (if a check declares ``egress``),
    opened for one check at a time, and its services (if its environment has any), ready
    before a check that needs them runs."""

    def __init__(
        self,
        proxy: EgressProxy | None,
        rules: Mapping[str, tuple[EgressRule, ...]],
        services: CheckServices | None = None,
    ) -> None:
        self.proxy = proxy
        self.rules = dict(rules)
        self.services = services
        self._lock = threading.Lock()
        self._open: str | None = None

    def open(self, check_id: str) -> None:
        """Makes ``check_id``'s services ready, then lets its pairs through (and nothing
        else) until :meth:`close`."""
        if self.services is not None:
            self.services.ensure(check_id)
        if self.proxy is None:
            return
        with self._lock:
            self.proxy.connections()  # what came before is no check's: dropped
            self.proxy.allow(self.rules.get(check_id, ()))
            self._open = check_id

    def close(self) -> list[Connection]:
        """Allows nothing again; the requests made since :meth:`open`."""
        with self._lock:
            if self._open is None or self.proxy is None:
                return []
            self._open = None
            self.proxy.allow(())
            return self.proxy.connections()

    def renew(self) -> None:
        """Before the fresh check sandbox: fresh services."""
        if self.services is not None:
            self.services.renew()

    def shutdown(self) -> None:
        """Removes the services, their network, the proxy and its network."""
        try:
            if self.services is not None:
                self.services.close()
        finally:
            if self.proxy is not None:
                self.proxy.close()

    def records(self) -> bool:
        """Whether a check's requests are recorded (the job has a proxy)."""
        return self.proxy is not None

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
