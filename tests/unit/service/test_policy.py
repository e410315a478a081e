"""What a tenant of ``patchbox serve`` may ask for, attacked over real HTTP: a tenant's task
is untrusted input, checked against its tenant's policy (environments, limits, checks,
modes) before anything is queued or built, and again when its job starts; ``auto`` never
applies for a tenant without ``allow_apply``."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.config.environment import EnvironmentSpec
from controller.config.limits import Limits
from controller.config.network import NetworkConfig
from controller.config.task import CheckSpec, TaskSpec
from controller.errors import EgressNotAllowedError, UsageError
from controller.service.config import LimitCaps, TenantConfig, load_service_config
from controller.service.policy import check_egress_of, refusals
from tests.support.jobs import GREET, make_repo
from tests.support.service import TASK, serving, write_config
from tests.support.service_policy import _py_env, error_of, not_allowed, submit


def test_a_named_environment_off_the_tenants_list_is_refused(tmp_path: Path) -> None:
    host = _py_env("x") + '[environments.secret]\nsetup = [["true"]]\n'
    config = write_config(
        tmp_path, workers=0, host=host, tenants={"alpha": 'environments = ["py"]'}
    )
    repo = make_repo(tmp_path / "alpha" / "greet")
    beta_repo = make_repo(tmp_path / "beta" / "greet")
    with serving(config) as running:
        alpha, beta = running.client("alpha"), running.client("beta")
        for name in ("secret", "undefined"):
            refused = submit(alpha, repo, TASK | {"environment": name})
            assert error_of(refused) == not_allowed(
                "alpha",
                f'environment {name!r} is not one the tenant may name (environments = ["py"])',
            )
        refused = submit(beta, beta_repo, TASK | {"environment": "py"})
        assert error_of(refused) == not_allowed(
            "beta", "environment 'py' is not one the tenant may name (environments = [])"
        )
        assert beta.get("/v1/jobs").json() == {"jobs": []}
        accepted = submit(alpha, repo, TASK | {"environment": "py"})
        assert accepted.status_code == 202, accepted.text
        assert accepted.json()["status"] == "queued"  # workers = 0: queued, nothing built


def test_limits_checks_and_modes_over_the_tenants_caps_are_refused(tmp_path: Path) -> None:
    caps = (
        "allow_inline_environment = true\n"
        "[service.tenants.max_limits]\n"
        "memory_mb = 2048\nwall_seconds = 1800\nchecks = 2\ncheck_seconds = 120\n"
        "setup_timeout_seconds = 600\n"
    )
    config = write_config(tmp_path, workers=0, tenants={"alpha": caps})
    repo = make_repo(tmp_path / "alpha" / "greet")
    beta_repo = make_repo(tmp_path / "beta" / "greet")
    greedy = TASK | {
        "mode": "trusted-auto",
        "limits": {"memory_mb": 65536, "workspace_mb": 64, "wall_seconds": 21600, "cpus": 64.0},
        "checks": {
            "a": {"argv": ["true"], "timeout_seconds": 86400},
            "b": {"argv": ["true"]},
            "c": {"argv": ["true"]},
        },
        "environment": {"setup_memory_mb": 65536, "setup_timeout_seconds": 21600},
    }
    with serving(config) as running:
        alpha, beta = running.client("alpha"), running.client("beta")
        assert error_of(submit(alpha, repo, greedy)) == not_allowed(
            "alpha",
            "mode 'trusted-auto' is the operator's: the service never runs it (use review or auto)",
            "environment.setup_memory_mb = 65536 is over max_limits.setup_memory_mb = 4096",
            "environment.setup_timeout_seconds = 21600 is over max_limits.setup_timeout_seconds = 600",
            "limits.memory_mb = 65536 is over max_limits.memory_mb = 2048",
            "limits.cpus = 64 is over max_limits.cpus = 1",
            "limits.wall_seconds = 21600 is over max_limits.wall_seconds = 1800",
            "limits.check_seconds = 300 (the default) is over max_limits.check_seconds = 120",
            "3 checks are over max_limits.checks = 2",
            "checks.a.timeout_seconds = 86400 is over max_limits.check_seconds = 120",
            "checks.b.timeout_seconds = 300 (the default) is over max_limits.check_seconds = 120",
            "checks.c.timeout_seconds = 300 (the default) is over max_limits.check_seconds = 120",
        )
        # the default caps are the task's defaults: beta may not raise a single limit
        one_more = TASK | {"limits": {**TASK["limits"], "max_turns": 51}}
        assert error_of(submit(beta, beta_repo, one_more)) == not_allowed(
            "beta", "limits.max_turns = 51 is over max_limits.max_turns = 50"
        )
        assert alpha.get("/v1/jobs").json() == {"jobs": []}
        assert beta.get("/v1/jobs").json() == {"jobs": []}
        # within the caps: accepted (a task that says nothing is within the defaults)
        assert submit(beta, beta_repo, {"prompt": "p"}).status_code == 202
        within = TASK | {
            "limits": {**TASK["limits"], "memory_mb": 2048, "check_seconds": 120},
            "checks": {"greet": GREET},
        }
        assert submit(alpha, repo, within).status_code == 202


# -- the configuration --------------------------------------------------------------------


def test_a_tenant_may_list_only_environments_the_host_defines(tmp_path: Path) -> None:
    config = write_config(
        tmp_path, host=_py_env("x"), tenants={"beta": 'environments = ["py", "go"]'}
    )
    with pytest.raises(
        UsageError,
        match="tenant 'beta' lists environments the host configuration does not define: go",
    ):
        load_service_config(config)
    wrong = write_config(
        tmp_path, tenants={"alpha": "[service.tenants.max_limits]\nmemory_mb = 1e9"}
    )
    with pytest.raises(UsageError, match=r"max_limits\.memory_mb"):
        load_service_config(wrong)


def test_the_default_caps_are_the_defaults_of_what_they_cap() -> None:
    caps = LimitCaps()
    for name, field in Limits.model_fields.items():
        assert getattr(caps, name) == field.default, name
    for name in ("setup_memory_mb", "setup_timeout_seconds"):
        assert getattr(caps, name) == EnvironmentSpec.model_fields[name].default, name
    assert caps.check_seconds == CheckSpec.model_fields["timeout_seconds"].default
    tenant = TenantConfig(name="t", token_sha256="0" * 64, repo_roots=["/r"])
    assert refusals(TaskSpec(prompt="p"), tenant) == []
    checks = {f"c{i}": CheckSpec(argv=["true"]) for i in range(caps.checks)}
    assert refusals(TaskSpec(prompt="p", checks=checks), tenant) == []


def test_a_checks_egress_is_held_to_the_tenant_and_the_operator(tmp_path: Path) -> None:
    host = '[network]\nallow = ["*.example.com:443", "files.example.org:443"]\n'
    config = write_config(
        tmp_path,
        workers=0,
        host=host,
        tenants={"alpha": 'egress_allow = ["api.example.com:443", "files.example.net:443"]'},
    )
    repo = make_repo(tmp_path / "alpha" / "greet")
    beta_repo = make_repo(tmp_path / "beta" / "greet")

    def task(*egress: str) -> dict[str, object]:
        return TASK | {"checks": {"net": {"argv": ["true"], "egress": list(egress)}}}

    with serving(config) as running:
        alpha, beta = running.client("alpha"), running.client("beta")
        # within both lists: accepted
        accepted = submit(alpha, repo, task("api.example.com:443"))
        assert accepted.status_code == 202, accepted.text
        # the operator allows it, the tenant's list does not
        status, code, message = error_of(submit(alpha, repo, task("other.example.com:443")))
        assert (status, code) == (403, "EGRESS_NOT_ALLOWED")
        assert "checks.net.egress" in message
        assert "other.example.com:443" in message
        assert "egress_allow" in message
        # the tenant's list names it, the operator does not allow it
        status, code, message = error_of(submit(alpha, repo, task("files.example.net:443")))
        assert (status, code) == (403, "EGRESS_NOT_ALLOWED")
        assert "files.example.net:443" in message
        # a tenant without egress_allow gets no network at all
        status, code, _ = error_of(submit(beta, beta_repo, task("files.example.org:443")))
        assert (status, code) == (403, "EGRESS_NOT_ALLOWED")
        assert beta.get("/v1/jobs").json() == {"jobs": []}
        # a malformed entry is a bad task
        status, code, _ = error_of(submit(alpha, repo, task("10.0.0.1:443")))
        assert (status, code) == (400, "USAGE_ERROR")


def test_a_tenants_own_environment_egress_is_held_to_its_egress_allow() -> None:
    """A tenant's inline environment declares setup egress within its ``egress_allow`` and
    the operator's ``allow``; a named environment, and the operator's ``setup_default``, are
    the operator's and not held to the tenant's list."""
    network = NetworkConfig(
        allow=["*.example.com:443"],
        presets={"pkgs": ["index.example.net:443"]},
        setup_default=["preset:pkgs"],
    )
    tenant = TenantConfig(
        name="t", token_sha256="0" * 64, repo_roots=["/r"], egress_allow=["a.example.com:443"]
    )

    def task(environment: object) -> TaskSpec:
        return TaskSpec.model_validate({"prompt": "p", "environment": environment})

    check_egress_of(task({"setup": [["true"]], "egress": ["a.example.com:443"]}), network, tenant)
    check_egress_of(task({"setup": [["true"]]}), network, tenant)  # the operator's default
    check_egress_of(task("named"), network, tenant)
    with pytest.raises(EgressNotAllowedError) as raised:
        check_egress_of(
            task({"setup": [["true"]], "egress": ["b.example.com:443"]}), network, tenant
        )
    assert "environment.egress" in raised.value.message
    assert "b.example.com:443" in raised.value.message
    assert "egress_allow" in raised.value.message
