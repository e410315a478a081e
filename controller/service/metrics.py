"""The service's Prometheus text: jobs by state, queued and running jobs, HTTP requests by
method, route and status. Queued and running jobs are totals, or per tenant (``tenant``
label) for the operator's metrics token only: tenant names are not for everybody."""

from __future__ import annotations

import threading
from collections import Counter
from typing import TYPE_CHECKING

from controller.service.store import QUEUED

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from controller.service.store import ServiceStore


class Metrics:
    """Request counts by method, route and status (thread safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: Counter[tuple[str, str, int]] = Counter()

    def count(self, method: str, route: str, status: int) -> None:
        with self._lock:
            self.requests[method, route, status] += 1

    def snapshot(self) -> dict[tuple[str, str, int], int]:
        with self._lock:
            return dict(self.requests)


def _series(name: str, values: dict[str, int], *, per_tenant: bool) -> list[str]:
    if per_tenant:
        return [f'{name}{{tenant="{t}"}} {n}' for t, n in sorted(values.items())]
    return [f"{name} {sum(values.values())}"]


def metrics_text(
    store: ServiceStore,
    metrics: Metrics,
    tenants: Sequence[str],
    running_count: Callable[[str], int],
    *,
    per_tenant: bool = False,
) -> str:
    """The metrics of ``store`` and ``metrics`` for ``tenants`` (``running_count`` of each);
    ``per_tenant`` labels the queued and running jobs with tenant names."""
    by_state: Counter[str] = Counter()
    queued: Counter[str] = Counter(dict.fromkeys(tenants, 0))
    for tenant in tenants:
        for row in store.list_jobs(tenant):
            by_state[row.state] += 1
            if row.state == QUEUED:
                queued[tenant] += 1
    running = {t: running_count(t) for t in tenants}
    whose = "per tenant" if per_tenant else "of all tenants"
    lines = [
        "# HELP patchbox_service_jobs Jobs of the service by state.",
        "# TYPE patchbox_service_jobs gauge",
        *(f'patchbox_service_jobs{{state="{s}"}} {n}' for s, n in sorted(by_state.items())),
        f"# HELP patchbox_service_queue_length Queued jobs {whose}.",
        "# TYPE patchbox_service_queue_length gauge",
        *_series("patchbox_service_queue_length", dict(queued), per_tenant=per_tenant),
        f"# HELP patchbox_service_running_jobs Running jobs {whose}.",
        "# TYPE patchbox_service_running_jobs gauge",
        *_series("patchbox_service_running_jobs", running, per_tenant=per_tenant),
        "# HELP patchbox_service_http_requests_total HTTP requests by method, route, status.",
        "# TYPE patchbox_service_http_requests_total counter",
        *(
            f'patchbox_service_http_requests_total{{method="{m}",route="{r}",status="{s}"}} {n}'
            for (m, r, s), n in sorted(metrics.snapshot().items())
        ),
    ]
    return "\n".join(lines) + "\n"
