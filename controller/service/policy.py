"""What a tenant's task may ask for. Through the service a task is the tenant's, not the
operator's: untrusted input, held to the tenant's configuration before it is queued and
again when its job starts (the configuration may have changed in between).

- ``mode``: ``review`` and ``auto`` (which applies only with ``allow_apply``, see
  :func:`apply_denied`); ``trusted-auto`` is the operator's.
- ``environment``: a name on the tenant's ``environments``; a block of its own only with
  ``allow_inline_environment``, its ``base`` one of ``inline_environment_bases`` (or none,
  the default sandbox base), its build within ``max_limits``.
- ``limits``, every check's ``timeout_seconds`` and the number of checks: within
  ``max_limits``.

Every refusal is ``TASK_NOT_ALLOWED`` naming each field over the policy and the key that
bounds it; a check's or its own environment's ``egress`` entry outside the tenant's
``egress_allow`` (or the host configuration's ``network.allow``) is ``EGRESS_NOT_ALLOWED``.
"""

from __future__ import annotations

import json

from controller.config.checks import check_egress
from controller.config.environment import EnvironmentSpec
from controller.config.host import HostConfig
from controller.config.network import NetworkConfig, setup_rules
from controller.config.task import TaskSpec
from controller.errors import ErrorCode, PatchboxError
from controller.repo.pin import Confinement, RepoPin, pin_repo
from controller.service.config import LimitCaps, ServiceConfig, TenantConfig
from controller.service.store import JobRow, Quota


def _listed(key: str, values: list[str]) -> str:
    return f"{key} = {json.dumps(values)}"


def _over(field: str, value: float, cap_key: str, cap: float, *, default: bool) -> str:
    given = " (the default)" if default else ""
    return f"{field} = {value:g}{given} is over max_limits.{cap_key} = {cap:g}"


def _environment(task: TaskSpec, tenant: TenantConfig) -> list[str]:
    chosen = task.environment
    if chosen is None:
        return []
    if not isinstance(chosen, EnvironmentSpec):
        if chosen in tenant.environments:
            return []
        named = _listed("environments", tenant.environments)
        return [f"environment {chosen!r} is not one the tenant may name ({named})"]
    if not tenant.allow_inline_environment:
        named = _listed("environments", tenant.environments)
        msg = (
            "an inline environment runs its setup as root, with its egress, on the service's "
            f"Docker host: the tenant may only name one of {named} "
            "(allow_inline_environment = false)"
        )
        return [msg]
    problems = []
    if chosen.base is not None and chosen.base not in tenant.inline_environment_bases:
        problems.append(
            f"environment.base {chosen.base!r} is not one of "
            f"{_listed('inline_environment_bases', tenant.inline_environment_bases)} "
            "(without a base the default sandbox base is used)"
        )
    problems += _service_images(chosen, tenant)
    caps = tenant.max_limits
    asked = chosen.model_fields_set
    for field in ("setup_memory_mb", "setup_timeout_seconds"):
        value, cap = getattr(chosen, field), getattr(caps, field)
        if value > cap:
            problems.append(
                _over(f"environment.{field}", value, field, cap, default=field not in asked)
            )
    return problems


def _service_images(environment: EnvironmentSpec, tenant: TenantConfig) -> list[str]:
    """An inline environment's services run images the operator listed, as its base: each
    ``image`` and each ``build.base`` one of the tenant's ``inline_environment_bases``."""
    allowed = tenant.inline_environment_bases
    problems = []
    for name, service in environment.services.items():
        build_base = service.build.base if service.build is not None else None
        for field, ref in (("image", service.image), ("build.base", build_base)):
            if ref is not None and ref not in allowed:
                problems.append(
                    f"environment.services.{name}.{field} {ref!r} is not one of "
                    f"{_listed('inline_environment_bases', allowed)}"
                )
    return problems


def _limits(task: TaskSpec, caps: LimitCaps) -> list[str]:
    problems = []
    asked = task.limits.model_fields_set
    for field in type(task.limits).model_fields:
        value, cap = getattr(task.limits, field), getattr(caps, field)
        if value > cap:
            problems.append(_over(f"limits.{field}", value, field, cap, default=field not in asked))
    if len(task.checks) > caps.checks:
        problems.append(f"{len(task.checks)} checks are over max_limits.checks = {caps.checks}")
    for check_id, check in task.checks.items():
        if check.timeout_seconds > caps.check_seconds:
            problems.append(
                _over(
                    f"checks.{check_id}.timeout_seconds",
                    check.timeout_seconds,
                    "check_seconds",
                    caps.check_seconds,
                    default="timeout_seconds" not in check.model_fields_set,
                )
            )
    return problems


def refusals(task: TaskSpec, tenant: TenantConfig) -> list[str]:
    """What of ``task`` the tenant may not ask for, one line each (empty: all of it may)."""
    problems = []
    if task.mode == "trusted-auto":
        problems.append(
            "mode 'trusted-auto' is the operator's: the service never runs it (use review or auto)"
        )
    problems += _environment(task, tenant)
    problems += _limits(task, tenant.max_limits)
    return problems


def check_egress_of(task: TaskSpec, network: NetworkConfig, tenant: TenantConfig) -> None:
    """``EGRESS_NOT_ALLOWED`` naming each of the task's checks' ``egress`` entries, and its
    own environment's, that the host configuration's ``network.allow`` or the tenant's
    ``egress_allow`` does not allow (a named environment is the operator's)."""
    check_egress(task.checks, network, allow=tenant.egress_allow)
    if isinstance(task.environment, EnvironmentSpec) and task.environment.egress is not None:
        setup_rules(task.environment.egress, network, allow=tenant.egress_allow)


def containers_of(task: TaskSpec, host: HostConfig) -> int:
    """The most containers a job of ``task`` holds at once: its sandbox and each service of
    its environment (one it names that the host does not define counts none)."""
    chosen = task.environment
    if isinstance(chosen, str):
        chosen = host.environments.get(chosen)
    return 1 + (len(chosen.services) if chosen is not None else 0)


def check_containers(task: TaskSpec, host: HostConfig, tenant: TenantConfig) -> None:
    """``TASK_NOT_ALLOWED`` for a job that needs more containers at once (its sandbox and
    its services) than the tenant's ``max_sandboxes``: it could never run."""
    cap = tenant.max_sandboxes
    needed = containers_of(task, host)
    if cap is not None and needed > cap:
        msg = (
            f"tenant {tenant.name!r} may not run this task: it needs {needed} containers at "
            f"once (its sandbox and {needed - 1} services), over max_sandboxes = {cap}"
        )
        raise PatchboxError(msg, code=ErrorCode.TASK_NOT_ALLOWED)


def check_task(task: TaskSpec, tenant: TenantConfig) -> None:
    """Raises ``TASK_NOT_ALLOWED`` naming everything of ``task`` over the tenant's policy."""
    problems = refusals(task, tenant)
    if problems:
        msg = f"tenant {tenant.name!r} may not run this task: " + "; ".join(problems)
        raise PatchboxError(msg[:2000], code=ErrorCode.TASK_NOT_ALLOWED)


def host_config_for(host: HostConfig, tenant: TenantConfig, row: JobRow) -> HostConfig:
    """The host configuration a job runs with: no spare sandbox for a bundle job (its clone
    goes when it ends) or for a tenant with ``max_sandboxes`` (a spare outlives its job)."""
    if row.request.bundle or tenant.max_sandboxes is not None:
        return host.model_copy(update={"spare_sandboxes": 0})
    return host


def confinement_of(service: ServiceConfig, tenant: TenantConfig) -> Confinement:
    """Where the tenant's repositories and their git data may be: its ``repo_roots``, never
    the service's own ``data_dir``."""
    return Confinement.of(tenant.name, tenant.repo_roots, [str(service.data_path())])


def pin_of(confinement: Confinement, row: JobRow) -> RepoPin | None:
    """The pin of a job on a tenant's repository as its submit stored it (None for a job
    on a bundle's clone); a job queued without one (by an older service) is pinned now."""
    if row.request.bundle:
        return None
    stored = row.request.pin
    if stored is None:
        return pin_repo(confinement, row.repo)
    return RepoPin.of_record(row.repo, stored, confinement)


def apply_denied(tenant: TenantConfig, row: JobRow) -> str | None:
    """Why the job's ``auto`` or ``trusted-auto`` may not apply it (None: it may): the
    tenant has no ``allow_apply``, or the job runs on an uploaded bundle's clone, which is
    no work tree of the tenant's. The engine's decision then stops for review."""
    if not tenant.allow_apply:
        return f"tenant {tenant.name!r} may not apply jobs (allow_apply = false)"
    if row.request.bundle:
        return "the job ran on an uploaded bundle: the service has no work tree to apply it in"
    return None


def quota_of(tenant: TenantConfig, host: HostConfig, row: JobRow) -> Quota:
    """The tenant's limits the claim of ``row`` holds across replicas, and what the job
    takes of them."""
    return Quota(
        tenant.job_limit(),
        containers_of(row.request.task, host),
        tenant.max_sandboxes,
        bool(row.request.bundle),
        tenant.max_clones,
    )
