"""Which checks a job may run: trusted configuration only.

Checks come from the operator's host configuration and the task file (the task wins on an
id both define). A repository may suggest checks in ``.patchbox/checks.json``; they are read
only with the explicit ``trust_repo_config`` opt-in, never by default, and never replace a
check the operator defined.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import TypeAdapter, ValidationError

from controller.config.environment import EnvironmentSpec
from controller.config.network import EgressRule, NetworkConfig, permitted, setup_rules
from controller.config.task import CheckId, CheckSpec, TaskSpec
from controller.errormap import describe_validation
from controller.errors import EgressNotAllowedError, UsageError

if TYPE_CHECKING:
    from controller.config.host import HostConfig

REPO_CHECKS_FILE = ".patchbox/checks.json"
MAX_REPO_CHECKS_BYTES = 64 * 1024

_REPO_CHECKS = TypeAdapter(dict[CheckId, CheckSpec])


def read_repo_checks(repo_root: Path) -> dict[str, CheckSpec]:
    """The repository's suggested checks: a regular file (no link at any component), at most
    64 KiB of strict JSON; a missing file means none. Anything else is a usage error."""
    try:
        dfd = os.open(repo_root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise UsageError("the repository cannot be opened") from exc
    try:
        sub = os.open(".patchbox", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dfd)
    except FileNotFoundError:
        os.close(dfd)
        return {}
    except OSError as exc:
        os.close(dfd)
        raise UsageError(f"{REPO_CHECKS_FILE}: not a plain folder") from exc
    os.close(dfd)
    try:
        fd = os.open("checks.json", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=sub)
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise UsageError(f"{REPO_CHECKS_FILE}: not a regular file") from exc
    finally:
        os.close(sub)
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            raise UsageError(f"{REPO_CHECKS_FILE}: not a regular file")
        data = fh.read(MAX_REPO_CHECKS_BYTES + 1)
    if len(data) > MAX_REPO_CHECKS_BYTES:
        raise UsageError(f"{REPO_CHECKS_FILE}: larger than {MAX_REPO_CHECKS_BYTES} bytes")
    try:
        return _REPO_CHECKS.validate_json(data)
    except ValidationError as exc:
        problems = describe_validation(exc, subject="checks", model=dict[CheckId, CheckSpec])
        raise UsageError(f"{REPO_CHECKS_FILE}: invalid: {problems}") from exc
    except json.JSONDecodeError as exc:
        raise UsageError(f"{REPO_CHECKS_FILE}: invalid ({exc.__class__.__name__})") from exc


def resolve_checks(
    task: Mapping[str, CheckSpec],
    host: Mapping[str, CheckSpec] | None = None,
    repo_root: Path | None = None,
    *,
    trust_repo_config: bool = False,
) -> dict[str, CheckSpec]:
    """The job's checks: host configuration, then the task (overrides by id), then, only
    with ``trust_repo_config``, the repository's suggestions for ids nobody else defined."""
    checks = dict(host or {})
    checks.update(task)
    if trust_repo_config and repo_root is not None:
        for check_id, spec in read_repo_checks(repo_root).items():
            checks.setdefault(check_id, spec)
    return checks


def job_checks(
    task: TaskSpec, config: HostConfig, repo_root: Path, *, trust_repo_config: bool
) -> tuple[dict[str, CheckSpec], EnvironmentSpec | None]:
    """A job's checks as it runs them, and its environment: the task's checks (or the host
    configuration's), the repository's with ``trust_repo_config``, each with the
    environment's variables. ``EGRESS_NOT_ALLOWED`` for a check's or the environment's
    ``egress`` the operator does not allow."""
    checks = resolve_checks(
        task.checks or config.checks, None, repo_root, trust_repo_config=trust_repo_config
    )
    environment = resolve_environment(task, config)
    if environment is not None:
        checks = with_environment(checks, environment)
        setup_rules(environment.egress, config.network)
    check_services(checks, environment, config.service_capabilities)
    check_egress(checks, config.network)
    return checks, environment


def needed_services(check: CheckSpec, environment: EnvironmentSpec | None) -> tuple[str, ...]:
    """The services ``check`` needs, in the environment's order: those it names, or (it
    names none) every one the environment declares."""
    declared = environment.services if environment is not None else {}
    if check.services is None:
        return tuple(declared)
    return tuple(name for name in declared if name in check.services)


def check_services(
    checks: Mapping[str, CheckSpec],
    environment: EnvironmentSpec | None,
    capabilities: Sequence[str] = (),
) -> None:
    """``USAGE_ERROR`` for a check naming a service the environment does not declare, and for
    a service keeping a capability the host configuration's ``service_capabilities`` does
    not allow."""
    declared = environment.services if environment is not None else {}
    problems: list[str] = []
    for check_id, check in checks.items():
        unknown = [n for n in check.services or () if n not in declared]
        if unknown:
            known = ", ".join(sorted(declared)) or "none"
            problems.append(
                f"check {check_id} names service(s) {', '.join(unknown)}, which the "
                f"environment does not declare (declared: {known})"
            )
    for name, service in declared.items():
        refused = [c for c in service.cap_add if c not in capabilities]
        if refused:
            problems.append(
                f"service {name} keeps capabilities {', '.join(refused)}, which the host "
                "configuration's service_capabilities does not allow"
            )
    if problems:
        raise UsageError("; ".join(problems)[:2000])


def check_egress(
    checks: Mapping[str, CheckSpec], network: NetworkConfig, *, allow: Sequence[str] | None = None
) -> dict[str, tuple[EgressRule, ...]]:
    """Each check's egress as rules, every entry allowed by the operator's ``network.allow``
    (and ``allow``, a tenant's own list, when given); ``EGRESS_NOT_ALLOWED`` naming every
    check's entries that are not."""
    rules: dict[str, tuple[EgressRule, ...]] = {}
    refused: list[str] = []
    for check_id, check in checks.items():
        if not check.egress:
            continue
        try:
            rules[check_id] = permitted(
                check.egress, network, allow=allow, where=f"checks.{check_id}.egress"
            )
        except EgressNotAllowedError as exc:
            refused.append(exc.message)
    if refused:
        raise EgressNotAllowedError("; ".join(refused)[:2000])
    return rules


def resolve_environment(task: TaskSpec, config: HostConfig) -> EnvironmentSpec | None:
    """The task's environment: given inline, or named from the host configuration
    (``UsageError`` for a name the configuration does not define)."""
    chosen = task.environment
    if chosen is None or isinstance(chosen, EnvironmentSpec):
        return chosen
    try:
        return config.environments[chosen]
    except KeyError:
        known = ", ".join(sorted(config.environments)) or "none"
        msg = f"the task names environment {chosen!r}, which the host configuration does not "
        msg += f"define (defined: {known})"
        raise UsageError(msg) from None


def with_environment(
    checks: Mapping[str, CheckSpec], environment: EnvironmentSpec
) -> dict[str, CheckSpec]:
    """Every check with the environment's variables (a check's own win)."""
    if not environment.env:
        return dict(checks)
    return {
        cid: c.model_copy(update={"env": {**environment.env, **c.env}}) for cid, c in checks.items()
    }
