"""What a tenant of ``patchbox serve`` may ask for, attacked over real HTTP: a tenant's task
is untrusted input, checked against its tenant's policy (environments, limits, checks,
modes) before anything is queued or built, and again when its job starts; ``auto`` never
applies for a tenant without ``allow_apply``."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import docker
import docker.errors
import pytest

from controller.jobs.store import JobStore
from controller.sandbox.environment import LABEL_KEY, LABEL_SPEC
from controller.sandbox.image import ImageBuilder
from tests.support.git import Repo, git_env
from tests.support.jobs import APP, APP_AFTER, GREET, containers_of, make_repo, snapshot
from tests.support.service import CALLS, TASK, events, serving, wait_status, write_config
from tests.support.service_policy import _py_env, error_of, not_allowed, submit

END = {"awaiting_review", "applied", "failed", "cancelled"}


# -- auto mode and allow_apply -------------------------------------------------------------


@pytest.mark.timeout(600)
def test_auto_never_applies_for_a_tenant_without_allow_apply(
    tmp_path: Path, client: docker.DockerClient, runtime: str
) -> None:
    del client
    config = write_config(tmp_path, host=f'allow_auto = true\nruntime = "{runtime}"')
    auto = TASK | {"mode": "auto"}
    beta_repo = make_repo(tmp_path / "beta" / "greet")
    alpha_repo = make_repo(tmp_path / "alpha" / "greet")
    before = snapshot(beta_repo)
    with serving(config) as running:
        beta, alpha = running.client("beta"), running.client("alpha")
        accepted = submit(beta, beta_repo, auto)
        assert accepted.status_code == 202, accepted.text
        job_id = accepted.json()["job_id"]
        view = wait_status(beta, job_id, END)
        assert view["status"] == "awaiting_review", view["error"]
        assert [c["status"] for c in view["checks"]] == ["passed"]
        decision = view["decision"]
        assert decision["applied"] is False
        assert decision["gates"]["apply_permitted"] is False
        assert {name for name, ok in decision["gates"].items() if not ok} == {"apply_permitted"}
        assert decision["reason"] == (
            "auto fell back to review: apply_permitted "
            "(tenant 'beta' may not apply jobs (allow_apply = false))"
        )
        assert JobStore().load(job_id).state == "awaiting_review"
        states = [e["data"]["state"] for e in events(beta, job_id) if e["type"] == "state"]
        assert "applied" not in states
        assert snapshot(beta_repo) == before
        assert (beta_repo / "app.py").read_text() == APP
        # the same task for a tenant with allow_apply applies: the gate is the tenant's
        allowed = submit(alpha, alpha_repo, auto)
        assert allowed.status_code == 202, allowed.text
        applied = wait_status(alpha, allowed.json()["job_id"], END)
        assert applied["status"] == "applied", applied["error"]
        assert applied["decision"]["reason"] == "auto: every gate holds"
        assert (alpha_repo / "app.py").read_text() == APP_AFTER
        # a bundle job has no work tree of the tenant's: even alpha's stops for review
        laptop = make_repo(tmp_path / "laptop")
        raw = Repo(laptop, git_env()).run("bundle", "create", "-", "HEAD").stdout
        uploaded = alpha.post(
            "/v1/bundles", content=raw, headers={"Content-Type": "application/octet-stream"}
        )
        assert uploaded.status_code == 201, uploaded.text
        body = {"bundle": uploaded.json()["bundle_id"], "task": auto, "calls": CALLS}
        on_bundle = alpha.post("/v1/jobs", json=body)
        assert on_bundle.status_code == 202, on_bundle.text
        view = wait_status(alpha, on_bundle.json()["job_id"], END)
        assert view["status"] == "awaiting_review", view["error"]
        assert view["decision"]["reason"] == (
            "auto fell back to review: apply_permitted (the job ran on an uploaded bundle: "
            "the service has no work tree to apply it in)"
        )


# -- environments, limits, modes: refused at submit, nothing queued or built -----------------


def _env_images(client: docker.DockerClient, marker: str) -> list[str]:
    """Environment images whose spec holds ``marker``."""
    found = client.images.list(filters={"label": "io.patchbox.kind=environment"})
    return [t for i in found if marker in i.labels.get(LABEL_SPEC, "") for t in i.tags]


def _build_steps(client: docker.DockerClient, marker: str) -> list[str]:
    """Environment build-step containers whose spec holds ``marker``."""
    found = client.containers.list(all=True, filters={"label": LABEL_KEY}, sparse=True)
    return [
        c.id or "" for c in found if marker in (c.attrs.get("Labels") or {}).get(LABEL_SPEC, "")
    ]


def _remove_env_images(client: docker.DockerClient, marker: str) -> None:
    for tag in _env_images(client, marker):
        with contextlib.suppress(docker.errors.APIError):
            client.images.remove(tag, force=True)


@pytest.fixture
def marker(client: docker.DockerClient) -> Iterator[str]:
    """A word unique to the test, in its environments' setup; their images go after it."""
    word = uuid.uuid4().hex
    yield word
    _remove_env_images(client, word)


@pytest.fixture
def private_image(client: docker.DockerClient) -> Iterator[str]:
    """An image on the service's daemon that no tenant was given: it holds a secret file."""
    base, _ = ImageBuilder(client).resolve_base(None)
    tag = f"patchbox-test-private:{uuid.uuid4().hex[:12]}"
    text = f"FROM {base}\nRUN echo private-{tag.rsplit(':', 1)[1]} > /secret\n"
    proc = subprocess.run(
        ["docker", "build", "-q", "-t", tag, "-"],
        input=text,
        text=True,
        capture_output=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    yield tag
    subprocess.run(["docker", "rmi", "-f", tag], capture_output=True, check=False)


def test_an_inline_environment_is_refused_and_nothing_is_built(
    tmp_path: Path, client: docker.DockerClient, private_image: str, marker: str
) -> None:
    """The reported attack: the tenant's own setup (root, network) from the daemon's private
    image, its check printing the image's secret. Refused by default; with inline
    environments allowed, a base the operator did not list is still refused."""
    host = _py_env(marker) + '[environments.secret]\nsetup = [["true"]]\n'
    inline_ok = 'allow_inline_environment = true\ninline_environment_bases = ["debian:12"]'
    config = write_config(
        tmp_path, host=host, tenants={"alpha": 'environments = ["py"]', "beta": inline_ok}
    )
    attack = TASK | {
        "checks": {"leak": {"argv": ["cat", "/secret"]}},
        "environment": {
            "base": private_image,
            "setup": [["sh", "-c", f"cat /secret; echo {marker}"]],
        },
    }
    without_base = TASK | {"environment": {"setup": [["sh", "-c", f"echo {marker}"]]}}
    repo = make_repo(tmp_path / "alpha" / "greet")
    beta_repo = make_repo(tmp_path / "beta" / "greet")
    with serving(config) as running:
        alpha, beta = running.client("alpha"), running.client("beta")
        inline = not_allowed(
            "alpha",
            "an inline environment runs its setup as root, with its egress, on the service's "
            'Docker host: the tenant may only name one of environments = ["py"] '
            "(allow_inline_environment = false)",
        )
        for task in (attack, without_base):
            assert error_of(submit(alpha, repo, task)) == inline
        base = not_allowed(
            "beta",
            f"environment.base {private_image!r} is not one of inline_environment_bases = "
            '["debian:12"] (without a base the default sandbox base is used)',
        )
        assert error_of(submit(beta, beta_repo, attack)) == base
        assert alpha.get("/v1/jobs").json() == {"jobs": []}
        assert beta.get("/v1/jobs").json() == {"jobs": []}
        metrics = running.client(None).get("/metrics").text
    assert 'route="/v1/jobs",status="403"} 3' in metrics
    assert _env_images(client, marker) == []
    assert _build_steps(client, marker) == []
    assert client.containers.list(all=True, filters={"ancestor": private_image}) == []


# -- what a tenant may name works, and its build counts against its quotas -----------------


@pytest.mark.timeout(900)
def test_an_allowed_environment_is_built_and_its_checks_run_in_it(
    tmp_path: Path, client: docker.DockerClient, runtime: str, marker: str
) -> None:
    """alpha names an environment on its list; beta, allowed inline environments on the
    base the operator listed, gives its own. Both build, and their checks see the image."""
    base, _ = ImageBuilder(client).resolve_base(None)
    inline = f"allow_inline_environment = true\ninline_environment_bases = [{json.dumps(base)}]"
    config = write_config(
        tmp_path,
        host=f'runtime = "{runtime}"\n' + _py_env(marker),
        tenants={"alpha": 'environments = ["py"]', "beta": inline},
    )
    in_env = {"greet": GREET, "env": {"argv": ["grep", "-qx", marker, "/opt/m"]}}
    own = {"base": base, "setup": [["sh", "-c", f"echo {marker} > /opt/m"]]}
    repos = {name: make_repo(tmp_path / name / "greet") for name in ("alpha", "beta")}
    tasks = {
        "alpha": TASK | {"checks": in_env, "environment": "py"},
        "beta": TASK | {"checks": in_env, "environment": own},
    }
    with serving(config) as running:
        jobs = {}
        for name in ("alpha", "beta"):
            accepted = submit(running.client(name), repos[name], tasks[name])
            assert accepted.status_code == 202, accepted.text
            jobs[name] = accepted.json()["job_id"]
        for name, job_id in jobs.items():
            view = wait_status(running.client(name), job_id, END, timeout=600)
            assert view["status"] == "awaiting_review", view["error"]
            statuses = {c["id"]: c["status"] for c in view["checks"]}
            assert statuses == {"greet": "passed", "env": "passed"}, view["checks"]
            record = JobStore().load(job_id)
            assert record.runtime == runtime
            assert record.environment is not None
            assert record.environment.tag in _env_images(client, marker)
            assert containers_of(client, job_id) == []


@pytest.mark.timeout(900)
def test_an_environment_build_holds_one_of_the_tenants_job_slots(
    tmp_path: Path, client: docker.DockerClient, marker: str, runtime: str
) -> None:
    """alpha may hold one sandbox: while its first job builds its environment, its second
    job stays queued."""
    config = write_config(
        tmp_path,
        runtime=runtime,
        host=_py_env(marker, ["sleep", "8"]),
        tenants={"alpha": 'environments = ["py"]\nmax_sandboxes = 1'},
    )
    first_repo = make_repo(tmp_path / "alpha" / "first")
    second_repo = make_repo(tmp_path / "alpha" / "second")
    with serving(config) as running:
        alpha = running.client("alpha")
        first = submit(alpha, first_repo, TASK | {"environment": "py"}).json()["job_id"]
        second = submit(alpha, second_repo, TASK).json()["job_id"]
        deadline = time.monotonic() + 300
        while not _build_steps(client, marker):
            assert time.monotonic() < deadline, "the environment build did not start"
            time.sleep(0.1)
        listed = {j["job_id"]: j["status"] for j in alpha.get("/v1/jobs").json()["jobs"]}
        assert listed == {first: "preparing", second: "queued"}
        for job_id in (first, second):
            view = wait_status(alpha, job_id, END, timeout=600)
            assert view["status"] == "awaiting_review", view["error"]
        environment = JobStore().load(first).environment
        assert environment is not None
        assert environment.built is True
        states = [e["data"]["state"] for e in events(alpha, second) if e["type"] == "state"]
        assert states[:2] == ["queued", "preparing"]


def test_a_queued_task_is_held_to_the_policy_again_when_its_job_starts(
    tmp_path: Path, client: docker.DockerClient, marker: str
) -> None:
    host = _py_env(marker)
    repo = make_repo(tmp_path / "alpha" / "greet")
    allowed = write_config(
        tmp_path, workers=0, host=host, tenants={"alpha": 'environments = ["py"]'}
    )
    with serving(allowed) as running:
        accepted = submit(running.client("alpha"), repo, TASK | {"environment": "py"})
        assert accepted.status_code == 202, accepted.text
        job_id = accepted.json()["job_id"]
    # the operator takes the environment off alpha's list; the queued job starts after it
    with serving(write_config(tmp_path, workers=2, host=host)) as running:
        alpha = running.client("alpha")
        view = wait_status(alpha, job_id, {"failed", "awaiting_review", "cancelled"})
        assert view["status"] == "failed"
        assert view["error"] == {
            "code": "TASK_NOT_ALLOWED",
            "message": "tenant 'alpha' may not run this task: environment 'py' is not one "
            "the tenant may name (environments = [])",
        }
        assert [e["data"]["state"] for e in events(alpha, job_id)] == ["queued", "failed"]
    assert _env_images(client, marker) == []
    assert _build_steps(client, marker) == []
    assert containers_of(client, job_id) == []


def test_a_queued_tasks_egress_is_held_to_the_tenant_again_when_its_job_starts(
    tmp_path: Path, client: docker.DockerClient
) -> None:
    """A check's egress within alpha's ``egress_allow`` at submit; the operator narrows the
    list before the job starts: the job fails ``EGRESS_NOT_ALLOWED`` naming the entry, with
    no proxy, no network and no sandbox started."""
    host = '[network]\nallow = ["*.example.com:443"]\n'
    task = TASK | {"checks": {"net": {"argv": ["true"], "egress": ["api.example.com:443"]}}}
    repo = make_repo(tmp_path / "alpha" / "greet")
    allowed = write_config(
        tmp_path, workers=0, host=host, tenants={"alpha": 'egress_allow = ["*.example.com:443"]'}
    )
    with serving(allowed) as running:
        accepted = submit(running.client("alpha"), repo, task)
        assert accepted.status_code == 202, accepted.text
        job_id = accepted.json()["job_id"]
    narrowed = write_config(
        tmp_path,
        workers=2,
        host=host,
        tenants={"alpha": 'egress_allow = ["other.example.com:443"]'},
    )
    with serving(narrowed) as running:
        alpha = running.client("alpha")
        view = wait_status(alpha, job_id, {"failed", "awaiting_review", "cancelled"})
        assert view["status"] == "failed"
        assert view["error"]["code"] == "EGRESS_NOT_ALLOWED"
        assert "checks.net.egress" in view["error"]["message"]
        assert "api.example.com:443" in view["error"]["message"]
        assert [e["data"]["state"] for e in events(alpha, job_id)] == ["queued", "failed"]
    assert containers_of(client, job_id) == []
    assert not client.networks.list(filters={"label": f"io.patchbox.job={job_id}"})
