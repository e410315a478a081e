"""Services beside a job's checks, with the real daemon: PostgreSQL and Redis images built
from Debian's packages on the local base (through the setup's proxy, the package hosts read
at run time), a real-shaped project whose pytest suite creates and queries a table, and one
that uses Redis. Without the service the check fails; with it the job reaches
``awaiting_review``, and the required run gets fresh services (the loop's rows are gone).
A service reaches nothing but its job's network; another job's check cannot reach it; a
service that never gets ready, one that exits and a bad image fail ``SERVICE_NOT_READY``
with nothing left. Both runtimes run the sandbox (and the services)."""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import docker
import pytest

from controller.config.task import TaskSpec
from controller.jobs.store import JobStore
from controller.paths import patchbox_home
from controller.sandbox.egress import PROXY_PORT, EgressProxy
from controller.sandbox.labels import JOB, OWNER_FILTER
from controller.sandbox.reaper import reap
from tests.support.cli import job_files
from tests.support.egress import labels_for
from tests.support.jobs import check_call, code_of, make_repo, new_job, patch_call, scripted
from tests.support.registries import network_table, package_hosts
from tests.support.services import CLIENTS, POSTGRES, REDIS, services_config

pytestmark = [pytest.mark.docker, pytest.mark.timeout(1800)]

RUNTIMES = ["runc", "runsc"]

DB_TEST = """
import os
import psycopg2

from app import greeting


def test_rows_round_trip():
    conn = psycopg2.connect(host="db", user="app", dbname="postgres", connect_timeout=5)
    cur = conn.cursor()
    cur.execute("SELECT count(*) FROM pg_tables WHERE tablename = 'visits'")
    before = cur.fetchone()[0]
    with open("/tmp/tables-before", "w") as fh:
        fh.write(str(before))
    cur.execute("CREATE TABLE IF NOT EXISTS visits (who text)")
    cur.execute("INSERT INTO visits VALUES (%s)", (greeting(),))
    conn.commit()
    cur.execute("SELECT who FROM visits")
    assert (greeting(),) in cur.fetchall()
    assert greeting() == "Hello"
    if os.environ.get("FRESH") == "1":
        assert before == 0, "the loop's table survived into the required run"
"""
CACHE_TEST = """
import redis

from app import greeting


def test_cache_round_trip():
    r = redis.Redis(host="cache", socket_timeout=5)
    r.set("greeting", greeting())
    assert r.get("greeting") == b"Hello"
"""
APP = 'def greeting():\n    return "hello"\n'
FIX = (
    "--- a/app.py\n+++ b/app.py\n@@ -1,2 +1,2 @@\n def greeting():\n"
    '-    return "hello"\n+    return "Hello"\n'
)


def _task(
    services: dict[str, Any], checks: dict[str, Any], *, baseline_checks: bool = True
) -> TaskSpec:
    return TaskSpec.model_validate(
        {
            "prompt": "Capitalize the greeting.",
            "checks": checks,
            "baseline_checks": baseline_checks,
            "environment": {"setup": CLIENTS, "services": services},
            "limits": {"memory_mb": 512, "workspace_mb": 64, "tmp_mb": 32, "wall_seconds": 900},
        }
    )


def _repo(tmp_path: Path) -> Path:
    return make_repo(
        tmp_path / "repo",
        {"app.py": APP, "tests/test_db.py": DB_TEST, "tests/test_cache.py": CACHE_TEST},
    )


def _pytest(path: str, **env: str) -> dict[str, Any]:
    return {
        "argv": ["python3", "-m", "pytest", "-q", "-p", "no:cacheprovider", path],
        "timeout_seconds": 120,
        "env": env,
    }


def _leftovers(client: docker.DockerClient, job_id: str) -> list[str]:
    """The job's containers and networks still there."""
    found = [
        "container " + str((c.attrs.get("Names") or [""])[0]).lstrip("/")
        for c in client.containers.list(all=True, filters={"label": f"{JOB}={job_id}"}, sparse=True)
    ]
    found += [
        f"network {n.name}"
        for n in client.networks.list(filters={"label": OWNER_FILTER})
        if job_id in (n.name or "")
    ]
    return found


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_pytest_suite_that_needs_postgres_and_redis(
    client: docker.DockerClient, tmp_path: Path, runtime: str
) -> None:
    """The loop's check creates the table; the required run starts from a fresh database
    (``FRESH``: the table must not be there before it creates it), and the job reaches
    ``awaiting_review`` with every service recorded and removed."""
    repo = _repo(tmp_path)
    checks = {
        "db": _pytest("tests/test_db.py", FRESH="1"),
        "cache": _pytest("tests/test_cache.py") | {"services": ["cache"]},
    }
    task = _task({"db": POSTGRES, "cache": REDIS}, checks)
    provider = scripted(
        [patch_call("p1", FIX)], [check_call("c1", "db")], [check_call("c2", "cache")]
    )
    job = new_job(client, repo, task, provider, config=services_config(), runtime=runtime)
    record = job.run()
    assert record.state == "awaiting_review", (
        record.error,
        [c.output_tail for c in record.checks],
        record.services,
    )
    loop_calls = [c for c in record.tool_calls if c.name == "run_check"]
    assert [c.ok for c in loop_calls] == [True, True]
    # the loop's database kept the table the check before the change made (the loop's
    # run, with FRESH=1, says so); the required run's database had none
    said = [t.calls[0].result for t in record.transcript if t.calls]
    assert "the loop's table survived" in said[1]
    assert '"status": "passed"' in said[2]
    assert {c.id: c.status for c in record.checks} == {"db": "passed", "cache": "passed"}
    by_sandbox = sorted((s.name, s.sandbox) for s in record.services)
    assert by_sandbox == [
        ("cache", "checks"),
        ("cache", "loop"),
        ("db", "checks"),
        ("db", "loop"),
    ]
    assert all(s.ready_seconds is not None for s in record.services)
    assert all(s.image_id.startswith("sha256:") for s in record.services)
    assert _leftovers(client, record.job_id) == []


def test_without_the_service_the_check_fails(client: docker.DockerClient, tmp_path: Path) -> None:
    """The same suite with no ``db`` service: the name does not resolve, the check fails."""
    repo = _repo(tmp_path)
    task = _task({"cache": REDIS}, {"db": _pytest("tests/test_db.py")})
    provider = scripted([patch_call("p1", FIX)])
    record = new_job(client, repo, task, provider, config=services_config()).run()
    assert record.state == "failed"
    assert code_of(record) == "CHECK_FAILED"
    assert "could not translate host name" in record.checks[0].output_tail
    assert _leftovers(client, record.job_id) == []


PROBE = r"""
import json, socket, sys
out = {}
for name, (host, port) in json.loads(sys.argv[1]).items():
    try:
        socket.create_connection((host, port), timeout=3).close()
        out[name] = "connected"
    except OSError as exc:
        out[name] = type(exc).__name__
try:
    socket.getaddrinfo(sys.argv[2], 80)
    out["dns"] = "resolved"
except OSError:
    out["dns"] = "unresolved"
print(json.dumps(out))
sys.exit(3 if "connected" in out.values() else 0)
"""


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_service_reaches_nothing_and_another_job_cannot_reach_it(
    client: docker.DockerClient, tmp_path: Path, runtime: str, proxy_tag: str
) -> None:
    """From inside a running service: no outside address, no host address, not the
    egress proxy of another job, no name outside the network resolves. While it runs, a
    second job's required check (on its own services network) cannot reach it by its
    address."""
    repo = _repo(tmp_path)
    outside_name = package_hosts()[0].rsplit(":", 1)[0]
    task = _task({"cache": REDIS}, {"cache": _pytest("tests/test_cache.py")})
    seen: dict[str, Any] = {}
    job_ids: list[str] = []

    def probe(message: str) -> None:
        if not message.startswith("service cache: ready") or seen:
            return
        found = client.containers.list(filters={"label": f"{JOB}={job_ids[0]}"})
        service = next(c for c in found if c.labels.get("dev.patchbox.service") == "cache")
        networks = service.attrs["NetworkSettings"]["Networks"]
        address = next(iter(networks.values()))["IPAddress"]
        subnet = client.networks.get("bridge").attrs["IPAM"]["Config"][0]["Subnet"]
        gateway = str(ipaddress.ip_network(subnet)[1])  # the host's address on the bridge
        targets = {
            "outside": ["198.51.100.7", 80],
            "host": [gateway, 2375],
            "proxy": [other_proxy.address, PROXY_PORT],  # another job's egress proxy
            "proxy outside": [proxy_outside, PROXY_PORT],  # the same, on its way out
            "itself": ["127.0.0.1", 6379],  # the probe connects where it can
        }
        result = service.exec_run(["python3", "-c", PROBE, json.dumps(targets), outside_name])
        output = result.output if isinstance(result.output, bytes) else b""
        seen["probe"] = json.loads(output.decode().strip().splitlines()[-1])
        reach = {"first": [address, 6379]}
        argv = ["python3", "-c", PROBE, json.dumps(reach), outside_name]
        other = _task({"cache": REDIS}, {"reach": {"argv": argv, "services": ["cache"]}})
        second = new_job(
            client,
            _repo(tmp_path / "second"),
            other,
            scripted([patch_call("p1", FIX)]),
            config=services_config(),
            runtime=runtime,
        ).run()
        seen["second"] = second

    other_proxy = EgressProxy.start(
        client, name=f"patchbox-egress-other-{uuid.uuid4().hex[:8]}",
        labels=labels_for("egress"), image=proxy_tag,
    )  # fmt: skip
    proxy_container = client.containers.get(f"{other_proxy.network}-proxy")
    proxy_outside = proxy_container.attrs["NetworkSettings"]["Networks"]["bridge"]["IPAddress"]
    job = new_job(
        client,
        repo,
        task,
        scripted([check_call("c1", "cache")]),
        config=services_config(),
        runtime=runtime,
        progress=probe,
    )
    job_ids.append(job.record.job_id)
    try:
        record = job.run()
    finally:
        other_proxy.close()
    assert record.state == "no_change", record.error
    assert seen["probe"]["itself"] == "connected", seen
    assert seen["probe"]["outside"] != "connected", seen
    assert seen["probe"]["host"] != "connected", seen
    assert seen["probe"]["proxy"] != "connected", seen
    assert seen["probe"]["proxy outside"] != "connected", seen
    assert seen["probe"]["dns"] == "unresolved", seen
    second = seen["second"]
    assert [(c.id, c.status) for c in second.checks] == [("reach", "passed")], second.checks
    assert "connected" not in second.checks[0].output_tail
    assert _leftovers(client, record.job_id) == []
    assert _leftovers(client, second.job_id) == []


BROKEN = {
    "never ready": (
        REDIS | {"ready": {"argv": ["false"], "timeout_seconds": 5}},
        "was not ready within 5 s",
    ),
    "exits": (
        REDIS | {"command": ["redis-server", "--no-such-option"]},
        "exited with code",
    ),
    "bad image": (
        {"image": "patchbox-test-no-such-image:1", "ready": {"argv": ["true"]}, "user": "1000"},
        "cannot be pulled",
    ),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_broken_service_fails_service_not_ready_with_nothing_left(
    client: docker.DockerClient, tmp_path: Path, case: str
) -> None:
    """The model's check is answered ``SERVICE_NOT_READY`` (the log's tail for one that
    ran); the required run fails the job with it; every container and network is gone."""
    service, words = BROKEN[case]
    repo = _repo(tmp_path)
    task = _task(
        {"cache": service}, {"cache": _pytest("tests/test_cache.py")}, baseline_checks=False
    )
    provider = scripted([check_call("c1", "cache")], [patch_call("p1", FIX)])
    record = new_job(client, repo, task, provider, config=services_config()).run()
    assert record.tool_calls[0].error_code == "SERVICE_NOT_READY"
    assert record.state == "failed"
    assert code_of(record) == "SERVICE_NOT_READY"
    assert record.error is not None
    assert words in record.error.message
    if case == "exits":
        assert "no-such-option" in record.error.message  # the log's tail
    assert [s.exit for s in record.services] == ["not ready", "not ready"]
    assert _leftovers(client, record.job_id) == []


KILLED_CONTROLLER = """
import sys
from pathlib import Path
from controller.config.task import TaskSpec
from controller.sandbox.dockerclient import connect
from tests.support.jobs import check_call, new_job, scripted
from tests.support.services import CLIENTS, REDIS, services_config

task = TaskSpec.model_validate({
    "prompt": "p",
    "baseline_checks": False,
    "checks": {"hold": {"argv": ["sleep", "600"], "timeout_seconds": 900}},
    "environment": {"setup": CLIENTS, "services": {"cache": REDIS}},
})
job = new_job(
    connect(), Path(sys.argv[1]), task, scripted([check_call("c1", "hold")]),
    config=services_config(), progress=lambda m: print(m, flush=True),
)
print("job", job.record.job_id, flush=True)
job.run()
"""


def test_the_reaper_removes_the_services_of_a_killed_controller(
    client: docker.DockerClient, tmp_path: Path
) -> None:
    """SIGKILL of the controller while its check runs beside a ready service: the service
    and its network stay (nothing removed them); the next reap removes both."""
    repo = _repo(tmp_path)
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_CONTROLLER, str(repo)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=str(Path(__file__).resolve().parents[3]),
    )
    assert proc.stdout is not None
    job_id = ""
    try:
        for line in proc.stdout:
            if line.startswith("job "):
                job_id = line.split()[1]
            if line.startswith("service cache: ready"):
                break
        else:
            pytest.fail("the child controller ended before its service was ready")
        time.sleep(1.0)  # the check starts
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    left = _leftovers(client, job_id)
    assert f"network patchbox-services-{job_id}" in left
    assert any(f"-{job_id}-cache" in name for name in left), left

    report = reap(client, patchbox_home() / "tmp")

    assert f"patchbox-services-{job_id}" in report.networks
    assert _leftovers(client, job_id) == []
    assert report.failures == 0


def test_a_cancelled_job_leaves_no_service(client: docker.DockerClient, tmp_path: Path) -> None:
    """A cancel while the check runs beside a ready service: the job ends ``cancelled``
    and its service, sandbox and network are gone."""
    repo = _repo(tmp_path)
    hold = {"argv": ["sleep", "600"], "timeout_seconds": 900, "services": ["cache"]}
    task = _task({"cache": REDIS}, {"hold": hold}, baseline_checks=False)
    holder: list[Any] = []

    def progress(message: str) -> None:
        if message.startswith("service cache: ready"):
            threading.Timer(1.0, holder[0].cancel).start()

    job = new_job(
        client,
        repo,
        task,
        scripted([check_call("c1", "hold")]),
        config=services_config(),
        progress=progress,
    )
    holder.append(job)
    record = job.run()
    assert record.state == "cancelled"
    assert [s.exit for s in record.services] == ["running"]
    assert _leftovers(client, record.job_id) == []


def test_a_service_from_an_image_reference(client: docker.DockerClient, tmp_path: Path) -> None:
    """A service given as ``image`` (a reference the Docker host has: here the Redis image
    an earlier job built) runs with its own entrypoint and the declared ``command``; one
    whose image would run as root without a ``user`` is refused."""
    repo = _repo(tmp_path)
    warm = _task({"cache": REDIS}, {"cache": _pytest("tests/test_cache.py")})
    built = new_job(
        client, repo, warm, scripted([check_call("c1", "cache")]), config=services_config()
    ).run()
    # an image of its own: Redis with a plain entrypoint and its user, as a registry's is
    maker = client.containers.create(built.services[0].image, command=["true"])
    tag = f"patchbox-test-redis:{uuid.uuid4().hex[:8]}"
    repository, version = tag.split(":")
    maker.commit(
        repository=repository,
        tag=version,
        changes=['ENTRYPOINT ["redis-server"]', 'CMD ["--dir", "/tmp"]', "USER redis"],
    )
    maker.remove()
    try:
        by_ref = {
            "image": tag,
            "command": ["--dir", "/tmp", "--protected-mode", "no"],
            "ready": REDIS["ready"],
        }
        task = _task({"cache": by_ref}, {"cache": _pytest("tests/test_cache.py")})
        record = new_job(
            client, repo, task, scripted([patch_call("p1", FIX)]), config=services_config()
        ).run()
    finally:
        client.images.remove(tag, force=True)
    assert record.state == "awaiting_review", (record.error, record.services)
    assert {s.image for s in record.services} == {tag}
    base = client.images.list(name="patchbox-base")[0].tags[0]
    rooted = _task(
        {"cache": {"image": base, "command": ["sleep", "60"], "ready": {"argv": ["true"]}}},
        {"cache": _pytest("tests/test_cache.py")},
        baseline_checks=False,
    )
    refused = new_job(
        client, repo, rooted, scripted([check_call("c1", "cache")]), config=services_config()
    ).run()
    assert refused.tool_calls[0].error_code == "SERVICE_NOT_READY"
    assert refused.error is None or refused.error.code != "INTERNAL_ERROR"
    said = refused.transcript[0].calls[0].result
    assert "runs as root; give the service the user" in said
    assert _leftovers(client, refused.job_id) == []


def test_sigterm_of_patchbox_run_removes_its_services(
    client: docker.DockerClient, tmp_path: Path
) -> None:
    """``patchbox run`` stopped by SIGTERM while its check runs beside a ready service:
    the job ends ``cancelled`` (exit 143) and the service, the sandbox and the network are
    gone, with no reaper."""
    repo = _repo(tmp_path)
    home = tmp_path / "home"
    hold = {"argv": ["sleep", "600"], "timeout_seconds": 900, "services": ["cache"]}
    task = {
        "prompt": "hold",
        "checks": {"hold": hold},
        "baseline_checks": False,
        "environment": {"setup": CLIENTS, "services": {"cache": REDIS}},
    }
    calls = {"turns": [[check_call("c1", "hold")]], "final": "done"}
    args = job_files(tmp_path / "in", task, calls, "spare_sandboxes = 0\n" + network_table())
    root = Path(__file__).resolve().parents[3]
    proc = subprocess.Popen(
        [sys.executable, "-m", "controller", "run", "--repo", str(repo), *args, "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=root,
        env={**os.environ, "PATCHBOX_HOME": str(home), "PYTHONPATH": str(root)},
    )
    assert proc.stderr is not None
    try:
        for line in proc.stderr:
            if "service cache: ready" in line:
                break
        else:
            pytest.fail("patchbox run ended before its service was ready")
        time.sleep(1.0)  # the check starts
        job_id = JobStore(home / "jobs").all()[-1].job_id
        assert _leftovers(client, job_id)
        proc.send_signal(signal.SIGTERM)
        out, _err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 143
    assert json.loads(out)["status"] == "cancelled"
    assert _leftovers(client, job_id) == []
