"""An environment's ``services`` and a check's ``services``: validated strictly, before
anything starts; a service's container arguments hardened; a tenant's ``max_sandboxes``
counts a job's services."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import docker
import pytest
from pydantic import ValidationError

from controller.config.checks import job_checks, needed_services
from controller.config.environment import EnvironmentSpec
from controller.config.host import HostConfig
from controller.config.services import ServiceSpec
from controller.config.task import TaskSpec
from controller.errors import PatchboxError, UsageError
from controller.jobs.records import JobRecord, ServiceRecord
from controller.jobs.summary import summary_text
from controller.sandbox.labels import KIND
from controller.sandbox.services import ServiceImage, service_config
from controller.service.config import TenantConfig
from controller.service.policy import check_containers, containers_of

READY = {"argv": ["true"]}
GOOD: dict[str, Any] = {"image": "example/db:1", "user": "db", "ready": READY}


def _service(**changes: Any) -> ServiceSpec:
    return ServiceSpec.model_validate(GOOD | changes)


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"image": None}, "exactly one of image and build"),
        ({"build": {"setup": [["true"]]}}, "exactly one of image and build"),
        ({"image": None, "build": {"setup": [["true"]]}, "command": None}, "command and its user"),
        ({"user": "root"}, "does not run as root"),
        ({"user": "0:0"}, "does not run as root"),
        ({"user": "a b"}, "is not a user name"),
        ({"env": {"DB_PASSWORD": "x"}}, "looks like a secret"),
        ({"env": {"LD_PRELOAD": "/x.so"}}, "load or run other code"),
        ({"env": {"URL": "postgres://u:p@h/db"}}, "a URL with a password"),
        ({"tmpfs": ["relative"]}, "absolute folder path"),
        ({"tmpfs": ["/etc/x"]}, "may not cover 'etc'"),
        ({"tmpfs": ["/a/../etc"]}, "absolute folder path"),
        ({"cap_add": ["cap_chown"]}, "should match pattern"),
        ({"ready": {"argv": []}}, "at least 1 item"),
        ({"ready": {"argv": ["true"], "timeout_seconds": 0}}, "greater than 0"),
        ({"limits": {"memory_mb": 1}}, "greater than or equal to 32"),
        ({"port": 5432}, "Extra inputs are not permitted"),
    ],
)
def test_a_bad_service_is_refused_naming_why(changes: dict[str, Any], words: str) -> None:
    with pytest.raises(ValidationError, match=words):
        _service(**changes)


@pytest.mark.parametrize("name", ["-db", "d" * 65, "db/x", "", "db x", ".db"])
def test_a_service_name_follows_the_check_id_rule(name: str) -> None:
    with pytest.raises(ValidationError):
        EnvironmentSpec.model_validate({"services": {name: GOOD}})
    for good in ["DB", "db_1", "db.x", "d" * 64]:
        EnvironmentSpec.model_validate({"services": {good: GOOD}})


def test_services_do_not_change_the_environment_image_label() -> None:
    from controller.sandbox.environment import label_spec

    spec = EnvironmentSpec.model_validate({"services": {"db": GOOD | {"env": {"A": "secret"}}}})
    assert "services" not in label_spec(spec)


def _task(checks: dict[str, Any], services: dict[str, Any] | None) -> TaskSpec:
    data: dict[str, Any] = {"prompt": "p", "checks": checks}
    if services is not None:
        data["environment"] = {"services": services}
    return TaskSpec.model_validate(data)


def test_a_check_naming_an_undeclared_service_is_refused(tmp_path: Path) -> None:
    task = _task({"t": {"argv": ["true"], "services": ["cache"]}}, {"db": GOOD})
    with pytest.raises(UsageError, match=r"names service\(s\) cache.*declared: db"):
        job_checks(task, HostConfig(), tmp_path, trust_repo_config=False)
    without = _task({"t": {"argv": ["true"], "services": ["db"]}}, None)
    with pytest.raises(UsageError, match="declared: none"):
        job_checks(without, HostConfig(), tmp_path, trust_repo_config=False)


def test_a_capability_the_operator_does_not_allow_is_refused(tmp_path: Path) -> None:
    task = _task({"t": {"argv": ["true"]}}, {"db": GOOD | {"cap_add": ["CHOWN"]}})
    with pytest.raises(UsageError, match="CHOWN, which the host configuration"):
        job_checks(task, HostConfig(), tmp_path, trust_repo_config=False)
    allowed = HostConfig(service_capabilities=["CHOWN"])
    _checks, environment = job_checks(task, allowed, tmp_path, trust_repo_config=False)
    assert environment is not None
    assert list(environment.services) == ["db"]


def test_which_services_a_check_needs() -> None:
    environment = EnvironmentSpec.model_validate({"services": {"db": GOOD, "cache": GOOD}})
    task = _task(
        {
            "all": {"argv": ["true"]},
            "one": {"argv": ["true"], "services": ["cache"]},
            "none": {"argv": ["true"], "services": []},
        },
        None,
    )
    assert needed_services(task.checks["all"], environment) == ("db", "cache")
    assert needed_services(task.checks["one"], environment) == ("cache",)
    assert needed_services(task.checks["none"], environment) == ()
    assert needed_services(task.checks["all"], None) == ()


def test_a_service_container_is_hardened() -> None:
    client = docker.DockerClient(base_url="unix:///nonexistent.sock", version="1.41")
    spec = _service(tmpfs=["/var/lib/db"], cap_add=["CHOWN"], limits={"pids": 64})
    image = ServiceImage("example/db:1", "sha256:abc", "db")
    config = service_config(
        client,
        name="db",
        container_name="patchbox-j-db",
        spec=spec,
        image=image,
        network="patchbox-services-j",
        labels={"dev.patchbox.job": "j"},
        runtime="runc",
        docker_runtime="runc",
    )
    assert config["user"] == "db"
    assert config["cap_drop"] == ["ALL"]
    assert config["cap_add"] == ["CHOWN"]
    assert config["security_opt"] == ["no-new-privileges:true"]
    assert config["read_only"] is True
    assert set(config["tmpfs"]) == {"/tmp", "/var/lib/db"}
    assert all("noexec" in o and "nosuid" in o for o in config["tmpfs"].values())
    assert config["pids_limit"] == 64
    assert config["mem_limit"] == "512m"
    assert config["dns"] == ["127.0.0.1"]
    assert config["network"] == "patchbox-services-j"
    assert config["labels"][KIND] == "service"
    assert "ports" not in config
    under_gvisor = service_config(
        client,
        name="db",
        container_name="c",
        spec=spec,
        image=image,
        network="n",
        labels={},
        runtime="runsc",
        docker_runtime="runsc-egress",
    )
    assert under_gvisor["runtime"] == "runsc-egress"
    assert under_gvisor["pids_limit"] > 64


def test_max_sandboxes_counts_a_job_s_services() -> None:
    task = _task({}, {"db": GOOD, "cache": GOOD})
    host = HostConfig()
    assert containers_of(task, host) == 3
    assert containers_of(_task({}, None), host) == 1
    tenant = TenantConfig(name="t", token_sha256="0" * 64, repo_roots=["/srv"], max_sandboxes=2)
    with pytest.raises(PatchboxError, match="needs 3 containers") as caught:
        check_containers(task, host, tenant)
    assert caught.value.code == "TASK_NOT_ALLOWED"
    check_containers(_task({}, {"db": GOOD}), host, tenant)


def test_show_prints_services_and_a_failed_one_s_log() -> None:
    record = JobRecord(job_id="j", repo="/r", state="failed")
    record.services = [
        ServiceRecord(
            name="db",
            image="example/db:1",
            image_id="sha256:" + "a" * 64,
            sandbox="loop",
            ready_seconds=1.25,
            exit="running",
        ),
        ServiceRecord(
            name="cache",
            image="example/cache:1",
            image_id="sha256:" + "b" * 64,
            sandbox="checks",
            ready_seconds=None,
            exit="not ready",
            log_tail="bad option\n",
        ),
    ]
    text = summary_text(record)
    assert (
        "  db (loop sandbox): example/db:1 [sha256:aaaaaaaaaaaa], ready in 1.2 s, running" in text
    )
    assert "cache (checks sandbox)" in text
    assert "never ready, not ready" in text
    assert "    | bad option" in text


def test_a_tenant_s_inline_services_run_only_listed_images() -> None:
    from controller.service.policy import refusals

    tenant = TenantConfig(
        name="t",
        token_sha256="0" * 64,
        repo_roots=["/srv"],
        allow_inline_environment=True,
        inline_environment_bases=["example/db:1"],
    )
    listed = _task({}, {"db": GOOD})
    assert refusals(listed, tenant) == []
    other = _task({}, {"db": GOOD | {"image": "example/other:2"}})
    [problem] = refusals(other, tenant)
    assert problem.startswith("environment.services.db.image 'example/other:2' is not one of ")
    assert "example/db:1" in problem
    built = _task(
        {},
        {
            "db": GOOD
            | {"image": None, "build": {"base": "x/y:1", "setup": [["true"]]}, "command": ["db"]}
        },
    )
    assert "services.db.build.base 'x/y:1'" in refusals(built, tenant)[0]
    default_base = _task(
        {}, {"db": GOOD | {"image": None, "build": {"setup": [["true"]]}, "command": ["db"]}}
    )
    assert refusals(default_base, tenant) == []


def test_remote_show_prints_services_escaped() -> None:
    from controller.cli.remote_text import summary

    view: dict[str, Any] = {
        "job_id": "j",
        "status": "failed",
        "services": [
            {
                "name": "db",
                "image": "i",
                "image_id": "sha256:1",
                "sandbox": "loop",
                "ready_seconds": 0.5,
                "exit": "running",
            },
            {
                "name": "cache",
                "image": "i",
                "image_id": "sha256:2",
                "sandbox": "checks",
                "ready_seconds": None,
                "exit": "not ready",
                "log_tail": "bad\x1b[2Kline\n",
            },
        ],
    }
    text = summary(view)  # type: ignore[arg-type]
    assert "  db (loop sandbox): i, ready in 0.5 s, running" in text
    assert "  cache (checks sandbox): i, never ready, not ready" in text
    assert "    | bad\\x1b[2Kline" in text
    assert "\x1b" not in text
