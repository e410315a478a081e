"""``patchbox serve``: the engine as a multi-tenant HTTP service (``docs/service.md``).

:mod:`.config` reads the ``[service]`` table of the host configuration, :mod:`.store` keeps
the service's jobs and events in SQLite, :mod:`.runner` runs them on a pool of worker
threads with per-tenant quotas and a fair queue, :mod:`.app` is the Starlette application
and :mod:`.openapi` its OpenAPI document.
"""
