"""Project environments: the block's rules, the generated build, and real jobs whose checks
need a toolchain or a package from the registries (Python with a PyPI plugin, Node with a
script in node_modules/.bin, C compiled by its check), through the CLI as a user runs them,
under runc and gVisor. Every failure is a clear code with nothing left behind."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import docker.errors
import pytest

from controller.config.environment import MAX_INPUT_FILES
from controller.jobs.store import JobStore
from controller.sandbox import environment as envmod
from controller.sandbox.environment import (
    LABEL_KEY,
)
from controller.sandbox.image import ImageBuilder
from tests.support.cli import job_files, patchbox
from tests.support.git import init
from tests.support.jobs import call, check_call, containers_of
from tests.support.registries import network_table

# -- real builds and jobs ------------------------------------------------------------------

PY_TEST = (
    "import datetime\nimport freezegun\nfrom app import today\n"
    "with freezegun.freeze_time('2024-02-29'):\n"
    "    assert today() == '2024-02-29', today()\n"
    "print('ok')\n"
)
PY_APP = "import datetime\n\ndef today():\n    return datetime.date.today().strftime('%Y/%m/%d')\n"
PY_ENV = {
    "setup": [
        ["sh", "-c", "apt-get update && apt-get install -y --no-install-recommends python3-pip"],
        [
            "python3",
            "-m",
            "pip",
            "install",
            "--no-cache-dir",
            "--break-system-packages",
            "-r",
            "requirements-test.txt",
        ],
    ],
    "inputs": ["requirements-test.txt"],
    "env": {"GREETING": "from-the-environment"},
}
HARDENED = (
    "test $(id -u) = 10001 && ! touch /usr/x 2>/dev/null && ! test -e /opt/patchbox-build"
    " && python3 -c 'import socket,sys; s=socket.socket(); s.settimeout(3);"
    ' sys.exit(0 if s.connect_ex(("10.0.0.1", 80)) else 1)\''
)
"""Checks in the environment's image run as the sandbox user, on a read-only root, with no
network, and the build's helpers (the CA bundle) are gone."""
PY_FIX = {
    "name": "replace_text",
    "arguments": {"path": "app.py", "oldText": "%Y/%m/%d", "newText": "%Y-%m-%d"},
}
LIMITS = {"memory_mb": 512, "workspace_mb": 64, "tmp_mb": 64, "wall_seconds": 300}


def _steps_left(client: docker.DockerClient, marker: str) -> list[str]:
    """Build-step containers of the environment whose spec holds ``marker``."""
    found = client.containers.list(all=True, filters={"label": LABEL_KEY}, sparse=True)
    return [
        c.id or ""
        for c in found
        if marker in (c.attrs.get("Labels") or {}).get(envmod.LABEL_SPEC, "")
    ]


def _env_images(client: docker.DockerClient, marker: str) -> list[str]:
    """Tagged environment images whose spec holds ``marker``."""
    found = client.images.list(filters={"label": "io.patchbox.kind=environment"})
    return [
        t
        for image in found
        if marker in image.labels.get(envmod.LABEL_SPEC, "")
        for t in image.tags
    ]


@pytest.fixture
def py_project(tmp_path: Path) -> Path:
    return init(
        tmp_path / "py",
        {
            "app.py": PY_APP,
            "test_app.py": PY_TEST,
            "requirements-test.txt": "freezegun\n",
        },
    ).path


NETWORK_BUILD = 1200
"""Seconds a job that builds its environment from the network may take."""


def _run(
    repo: Path,
    folder: Path,
    task: dict[str, Any],
    turns: list[list[dict[str, Any]]],
    *extra: str,
    config: str | None = None,
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """A job through the CLI; by default its setup steps reach the package hosts only."""
    if config is None:
        config = "spare_sandboxes = 0\n" + network_table()
    args = job_files(folder, task, {"turns": turns, "final": "done"}, config)
    # a first job builds its environment over the network (apt, PyPI): minutes on a slow day
    proc = patchbox("run", "--repo", str(repo), *args, *extra, "--json", timeout=NETWORK_BUILD)
    return proc, json.loads(proc.stdout or "{}")


def _record(home: Path, job_id: str) -> dict[str, Any]:
    """The job's record as stored (its log replayed), as JSON data."""
    data: dict[str, Any] = JobStore(home / "jobs").load(job_id).model_dump(mode="json")
    return data


@pytest.mark.docker
@pytest.mark.timeout(NETWORK_BUILD + 300)
def test_a_python_project_needs_its_plugin_and_gets_it_from_an_environment(
    docker_client: docker.DockerClient,
    sandbox_image: str,
    runtime: str,
    py_project: Path,
    tmp_path: Path,
) -> None:
    """Without an environment the check fails (freezegun is missing); with one that installs
    it from the registry the job passes, and its checks see the environment's variables. A
    second job on the same environment starts without a build."""
    del sandbox_image
    checks = {
        "tests": {"argv": ["python3", "test_app.py"], "timeout_seconds": 60},
        "env": {"argv": ["sh", "-c", 'test "$GREETING" = from-the-environment']},
        "hardened": {"argv": ["sh", "-c", HARDENED]},
    }
    turns = [[call("c1", PY_FIX)], [check_call("c2", "tests")]]
    bare = {"prompt": "Use ISO dates.", "checks": checks, "limits": LIMITS}
    proc, out = _run(py_project, tmp_path / "bare", bare, turns, "--runtime", runtime)
    assert proc.returncode == 1, proc.stderr
    assert out["status"] == "failed"
    tests = next(c for c in out["checks"] if c["id"] == "tests")
    assert tests["status"] == "failed"
    assert "No module named 'freezegun'" in tests["output_tail"]

    task = {**bare, "environment": PY_ENV}
    first, out = _run(py_project, tmp_path / "env1", task, turns, "--runtime", runtime)
    assert first.returncode == 0, first.stderr[-3000:]
    assert out["status"] == "awaiting_review"
    statuses = {c["id"]: c["status"] for c in out["checks"]}
    assert statuses == {"tests": "passed", "env": "passed", "hardened": "passed"}
    home = Path(os.environ["PATCHBOX_HOME"])
    env1 = _record(home, out["job_id"])["environment"]
    assert env1["tag"].startswith("patchbox-env:")

    again, out = _run(py_project, tmp_path / "env2", task, turns, "--runtime", runtime)
    assert again.returncode == 0, again.stderr[-3000:]
    env2 = _record(home, out["job_id"])["environment"]
    assert (env2["tag"], env2["built"], env2["steps"]) == (env1["tag"], False, [])
    assert "environment: building" not in again.stderr
    assert env2["seconds"] < 5


NODE_PACKAGE = {
    "name": "demo",
    "version": "1.0.0",
    "private": True,
    "scripts": {"test": "check-add"},
    "devDependencies": {"check-add": "file:tools/check-add"},
}
NODE_TOOL = {"name": "check-add", "version": "1.0.0", "bin": {"check-add": "bin.js"}}
NODE_BIN = (
    "#!/usr/bin/env node\n"
    "const add = require(process.cwd() + '/index.js');\n"
    "if (add(2, 3) !== 5) { console.error('add(2, 3) is ' + add(2, 3)); process.exit(1); }\n"
    "console.log('add ok');\n"
)
NODE_ENV = {
    "setup": [
        ["sh", "-c", "apt-get update && apt-get install -y --no-install-recommends nodejs npm"],
        ["npm", "install", "--offline", "--install-links", "--no-audit", "--no-fund"],
    ],
    "inputs": ["package.json", "tools"],
}
C_SOURCE = '#include <stdio.h>\nint add(int a, int b) { return a - b; }\nint main(void) {\n    if (add(2, 3) != 5) { puts("add is wrong"); return 1; }\n    puts("add ok");\n    return 0;\n}\n'


@pytest.mark.docker
@pytest.mark.timeout(NETWORK_BUILD + 300)
def test_a_node_project_runs_a_script_from_node_modules_bin(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    """node and npm from Debian's packages in the setup; ``npm test`` runs ``check-add`` from
    node_modules/.bin, which the setup installed and the sandbox sees as the seed's link.
    The link is not a change: the job's diff holds only the fix."""
    del docker_client, sandbox_image
    repo = init(
        tmp_path / "node",
        {
            "package.json": json.dumps(NODE_PACKAGE),
            "tools/check-add/package.json": json.dumps(NODE_TOOL),
            "tools/check-add/bin.js": (0o755, NODE_BIN.encode()),
            "index.js": "module.exports = function add(a, b) { return a - b; };\n",
            "README.md": "# demo\n",
        },
    ).path
    task = {
        "prompt": "Fix add.",
        "checks": {"test": {"argv": ["npm", "test"], "timeout_seconds": 120}},
        "baseline_checks": False,  # failing before too would only wait for review
        "limits": LIMITS,
        "environment": NODE_ENV,
    }
    fix = {
        "name": "replace_text",
        "arguments": {"path": "index.js", "oldText": "a - b", "newText": "a + b"},
    }
    notes = {
        "name": "replace_text",
        "arguments": {"path": "README.md", "oldText": "demo", "newText": "add"},
    }
    proc, out = _run(repo, tmp_path / "unfixed", task, [[call("c1", notes)]])
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert out["error"]["code"] == "CHECK_FAILED", out["error"]
    [check] = out["checks"]
    assert check["status"] == "failed"
    assert "check-add" in check["output_tail"]
    assert "add(2, 3) is -1" in check["output_tail"]
    turns = [[check_call("c1", "test")], [call("c2", fix)], [check_call("c3", "test")]]
    proc, out = _run(repo, tmp_path / "job", task, turns)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert out["status"] == "awaiting_review"
    assert [f["path"] for f in out["files"]] == ["index.js"]
    [check] = out["checks"]
    assert check["status"] == "passed"
    assert "add ok" in check["output_tail"]


@pytest.mark.docker
@pytest.mark.timeout(NETWORK_BUILD + 300)
def test_a_c_program_is_compiled_and_run_by_its_check(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    del docker_client, sandbox_image
    repo = init(tmp_path / "c", {"add.c": C_SOURCE}).path
    check = {
        "argv": [
            "sh",
            "-c",
            "gcc -o /tmp/add add.c && /tmp/add && gcc -o add add.c && ./add && rm add",
        ]
    }
    task = {
        "prompt": "Fix add.",
        "checks": {"build": check},
        "limits": LIMITS,
        "environment": {
            "setup": [
                [
                    "sh",
                    "-c",
                    "apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev",
                ]
            ]
        },
    }
    fix = {
        "name": "replace_text",
        "arguments": {"path": "add.c", "oldText": "a - b", "newText": "a + b"},
    }
    turns = [[check_call("c1", "build")], [call("c2", fix)]]
    proc, out = _run(repo, tmp_path / "job", task, turns)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [check] = out["checks"]
    assert (check["status"], check["output_tail"].split()) == ("passed", ["add", "ok", "add", "ok"])
    assert [f["path"] for f in out["files"]] == ["add.c"]


FLIT_PYPROJECT = """\
[build-system]
requires = ["flit_core>=3.2,<4"]
build-backend = "flit_core.buildapi"

[project]
name = "tinyflit"
version = "0.1.0"
description = "A tiny project built with flit."
"""
FLIT_MODULE = "def double(x):\n    return x + x + 1\n"
FLIT_TEST = "from tinyflit import double\n\ndef test_double():\n    assert double(2) == 4\n"
VENV = "/workspace/.venv/bin/python"
FLIT_ENV = {
    "setup": [
        ["sh", "-c", "apt-get update && apt-get install -y --no-install-recommends python3-venv"],
        ["python3", "-m", "venv", "/workspace/.venv"],
        [VENV, "-m", "pip", "install", "--no-cache-dir", "--upgrade", "pip"],
        [VENV, "-m", "pip", "install", "--no-cache-dir", ".", "pytest"],
        [VENV, "-m", "pip", "install", "--no-cache-dir", "-e", "."],
    ],
    "inputs": ["pyproject.toml", "tinyflit"],
}
"""The common setup on the default base: a venv, a current pip, the project installed by
its own build backend (a wheel, then editable)."""


@pytest.mark.docker
@pytest.mark.timeout(NETWORK_BUILD + 300)
def test_a_flit_project_installs_itself_in_a_venv_and_its_suite_runs(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    """flit_core zips the staged inputs into a wheel, which holds no date before 1980: with
    the inputs staged at a fixed date it builds (``pip install .`` and ``-e .``), and the
    project's suite runs from the venv in the seed."""
    del docker_client, sandbox_image
    repo = init(
        tmp_path / "flit",
        {
            "pyproject.toml": FLIT_PYPROJECT,
            "tinyflit/__init__.py": FLIT_MODULE,
            "tests/test_tiny.py": FLIT_TEST,
        },
    ).path
    installed = (
        "import importlib.metadata as m, json;"
        " d = m.distribution('tinyflit');"
        " assert d.version == '0.1.0', d.version;"
        " assert json.loads(d.read_text('direct_url.json'))['dir_info']['editable']"
    )
    task = {
        "prompt": "Fix double.",
        "checks": {
            "tests": {"argv": [VENV, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"]},
            "installed": {"argv": [VENV, "-c", installed]},
        },
        "limits": LIMITS,
        # a variable of this run's own: the key is new, so this run builds (an image left by
        # an earlier run on the same daemon would otherwise be found and nothing built)
        "environment": {**FLIT_ENV, "env": {"PATCHBOX_TEST_RUN": uuid.uuid4().hex}},
    }
    fix = {
        "name": "replace_text",
        "arguments": {"path": "tinyflit/__init__.py", "oldText": "x + x + 1", "newText": "x + x"},
    }
    turns = [[call("c1", fix)], [check_call("c2", "tests")]]
    proc, out = _run(repo, tmp_path / "job", task, turns)
    assert proc.returncode == 0, (out.get("error"), proc.stderr[-3000:])
    assert out["status"] == "awaiting_review", out["error"]
    statuses = {c["id"]: c["status"] for c in out["checks"]}
    assert statuses == {"tests": "passed", "installed": "passed"}
    home = Path(os.environ["PATCHBOX_HOME"])
    steps = [s["name"] for s in _record(home, out["job_id"])["environment"]["steps"]]
    assert any(s.endswith("-m pip install --no-cache-dir -e .") for s in steps), steps
    assert [f["path"] for f in out["files"]] == ["tinyflit/__init__.py"]


def _minimal_task(environment: object) -> dict[str, Any]:
    return {
        "prompt": "p",
        "checks": {"ok": {"argv": ["true"]}},
        "limits": LIMITS,
        "environment": environment,
    }


@pytest.mark.docker
def test_a_failing_setup_step_names_the_step_its_exit_code_and_its_log(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    del sandbox_image
    repo = init(tmp_path / "p", {"a.txt": "a\n"}).path
    marker = uuid.uuid4().hex
    failing = {
        "setup": [["sh", "-c", f"echo first-{marker}"], ["sh", "-c", f"echo boom-{marker}; exit 3"]]
    }
    proc, out = _run(repo, tmp_path / "job", _minimal_task(failing), [])
    assert proc.returncode == 1
    error = out["error"]
    assert error["code"] == "ENVIRONMENT_BUILD_FAILED"
    assert f"setup 2/2: sh -c echo boom-{marker}; exit 3" in error["message"]
    assert "exit code 3" in error["message"]
    assert f"boom-{marker}" in error["message"]
    assert out["status"] == "failed"
    assert not _env_images(docker_client, marker)
    assert not _steps_left(docker_client, marker)


@pytest.fixture(scope="module")
def bare_bases(docker_client: docker.DockerClient) -> Iterator[dict[str, str]]:
    """Two bases made from the default one: without python3 (apt-get kept), and without
    python3 and without any package manager. Each holds a mark of this run's own, so its
    image id (and an environment's key on it) is new even where an earlier run's layers are
    in the daemon's cache."""
    base, _ = ImageBuilder(docker_client).resolve_base(None)
    tags = {
        "apt": f"patchbox-test-nopython:{uuid.uuid4().hex[:8]}",
        "none": f"patchbox-test-bare:{uuid.uuid4().hex[:8]}",
    }
    scripts = {
        "apt": "apt-get purge -y -qq python3-minimal python3.11-minimal >/dev/null 2>&1; ! command -v python3",
        "none": "rm -f /usr/bin/python3* /usr/bin/apt-get /usr/bin/apt /usr/bin/dpkg; ! command -v python3",
    }
    for kind, tag in tags.items():
        mark = uuid.uuid4().hex
        dockerfile_text = (
            f"FROM {base}\nRUN echo {mark} > /etc/patchbox-test-run; {scripts[kind]}\n"
        )
        proc = subprocess.run(
            ["docker", "build", "-q", "-t", tag, "-"],
            input=dockerfile_text,
            text=True,
            capture_output=True,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
    yield tags
    for tag in tags.values():
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True, check=False)


@pytest.mark.docker
@pytest.mark.timeout(NETWORK_BUILD + 300)
def test_a_base_without_python_gets_it_from_its_package_manager(
    docker_client: docker.DockerClient, bare_bases: dict[str, str], tmp_path: Path
) -> None:
    repo = init(tmp_path / "p", {"a.txt": "a\n"}).path
    edit = {"name": "replace_text", "arguments": {"path": "a.txt", "oldText": "a", "newText": "b"}}
    task = _minimal_task({"base": bare_bases["apt"]})
    proc, out = _run(repo, tmp_path / "job", task, [[call("c1", edit)]])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert out["status"] == "awaiting_review"
    assert out["checks"][0]["status"] == "passed"
    assert "environment: python3 for the agent" in proc.stderr


@pytest.mark.docker
def test_a_base_without_python_or_a_package_manager_is_refused_naming_it(
    docker_client: docker.DockerClient, bare_bases: dict[str, str], tmp_path: Path
) -> None:
    repo = init(tmp_path / "p", {"a.txt": "a\n"}).path
    proc, out = _run(repo, tmp_path / "job", _minimal_task({"base": bare_bases["none"]}), [])
    assert proc.returncode == 1
    assert out["error"]["code"] == "ENVIRONMENT_BUILD_FAILED"
    message = out["error"]["message"]
    assert "python3 for the agent" in message
    assert "no python3 >= 3.9 and no package manager" in message
    assert "apt-get, apk, dnf" in message
    assert not _env_images(docker_client, bare_bases["none"])


@pytest.mark.docker
def test_a_base_that_is_not_there_and_cannot_be_pulled(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    del docker_client, sandbox_image
    repo = init(tmp_path / "p", {"a.txt": "a\n"}).path
    name = f"patchbox-test-absent:{uuid.uuid4().hex[:8]}"
    proc, out = _run(repo, tmp_path / "job", _minimal_task({"base": name}), [])
    assert proc.returncode == 1
    assert out["error"]["code"] == "ENVIRONMENT_BUILD_FAILED"
    assert (
        f"the base image {name!r} is not on this Docker host and cannot be pulled"
        in out["error"]["message"]
    )


@pytest.mark.docker
def test_setup_over_its_time_is_stopped_and_nothing_is_left(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    del sandbox_image
    repo = init(tmp_path / "p", {"a.txt": "a\n"}).path
    marker = uuid.uuid4().hex
    slow = {"setup": [["sh", "-c", f"sleep 600 # {marker}"]], "setup_timeout_seconds": 8}
    proc, out = _run(repo, tmp_path / "job", _minimal_task(slow), [])
    assert proc.returncode == 1
    assert out["error"]["code"] == "ENVIRONMENT_BUILD_FAILED"
    assert "the setup did not finish within 8 s" in out["error"]["message"]
    assert not _env_images(docker_client, marker)
    assert not _steps_left(docker_client, marker)


def _reports(stderr: str, step: str) -> list[int]:
    """The elapsed seconds of each progress line that names ``step`` while it runs."""
    found = []
    for line in stderr.splitlines():
        head, sep, rest = line.partition(f"environment: {step} (")
        if sep and head.startswith("patchbox: [") and rest.endswith(" s)"):
            found.append(int(rest.removesuffix(" s)")))
    return found


@pytest.mark.docker
def test_a_step_that_runs_long_is_reported_every_10_seconds(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    """A setup step that writes nothing for 25 s is named with its time at 10 and 20 s, by
    ``env build`` and by a ``run`` that builds its environment."""
    del sandbox_image
    repo = init(tmp_path / "p", {"a.txt": "a\n"}).path
    tags = []
    for command in ("env build", "run"):
        marker = uuid.uuid4().hex
        step = f"sleep 25 # {marker}"
        task = {"prompt": "p", "environment": {"setup": [["sh", "-c", step]]}, "limits": LIMITS}
        if command == "run":
            proc, out = _run(repo, tmp_path / "job", task, [])
            assert out["error"]["code"] == "MODEL_TOOL_CALL_UNSUPPORTED", proc.stderr[-2000:]
            tags.append(_record(Path(os.environ["PATCHBOX_HOME"]), out["job_id"])["environment"])
        else:
            (tmp_path / "task.json").write_text(json.dumps(task))
            proc = patchbox(
                "env", "build", "--task", str(tmp_path / "task.json"), "--repo", str(repo)
            )
            assert proc.returncode == 0, proc.stderr[-3000:]
            tags.append({"tag": _env_images(docker_client, marker)[0]})
        # every 10 s while the step runs: at 10 and 20 s of its 25, and at 30 s more when
        # committing its layer takes the daemon past that (a loaded machine)
        reports = _reports(proc.stderr, f"setup 1/1: sh -c {step}")
        assert reports[:2] == [10, 20], proc.stderr
        assert reports == [10 * (i + 1) for i in range(len(reports))], proc.stderr
        assert len(reports) <= 4, proc.stderr  # at most 40 s for a 25 s step
    for found in tags:
        docker_client.images.remove(found["tag"])


@pytest.mark.docker
def test_input_errors_are_clear_and_start_nothing(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    del sandbox_image
    made = init(tmp_path / "p", {"a.txt": "a\n"}, symlinks={"link": "a.txt"})
    for i in range(MAX_INPUT_FILES + 1):
        made.write(f"many/{i}.txt", "x")
    made.commit("many")
    repo = made.path
    cases = [
        ({"inputs": ["link"]}, "ENVIRONMENT_INPUT_INVALID", "is a symbolic link", 1),
        (
            {"inputs": ["many"]},
            "ENVIRONMENT_INPUT_INVALID",
            f"select {MAX_INPUT_FILES + 1} files",
            1,
        ),
        ({"inputs": ["nothing/*"]}, "ENVIRONMENT_INPUT_INVALID", "matches no file", 1),
        ({"inputs": ["../outside.txt"]}, "USAGE_ERROR", "leaves the repository", 2),
    ]
    for i, (block, code, fragment, status) in enumerate(cases):
        proc, out = _run(repo, tmp_path / f"job{i}", _minimal_task(block), [])
        assert proc.returncode == status, (block, proc.stderr)
        assert out["error"]["code"] == code, block
        assert fragment in out["error"]["message"], block
        if "job_id" in out:  # the job failed before any sandbox, and left none
            assert out["status"] == "failed"
            assert not containers_of(docker_client, out["job_id"])


@pytest.mark.docker
def test_env_commands_build_list_show_and_prune(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    del sandbox_image
    repo = init(tmp_path / "p", {"req.txt": "x\n"}).path
    marker = uuid.uuid4().hex
    task = {
        "prompt": "p",
        "environment": {"setup": [["sh", "-c", f"echo {marker} > /opt/m"]], "inputs": ["req.txt"]},
    }
    (tmp_path / "task.json").write_text(json.dumps(task))
    built = patchbox(
        "env", "build", "--task", str(tmp_path / "task.json"), "--repo", str(repo), "--json"
    )
    assert built.returncode == 0, built.stderr[-3000:]
    data = json.loads(built.stdout)
    assert data["built"] is True
    assert [s["name"] for s in data["steps"] if s["name"].startswith("setup")] == [
        f"setup 1/1: sh -c echo {marker} > /opt/m"
    ]
    assert "environment: setup 1/1" in built.stderr
    again = json.loads(
        patchbox(
            "env", "build", "--task", str(tmp_path / "task.json"), "--repo", str(repo), "--json"
        ).stdout
    )
    assert (again["tag"], again["built"]) == (data["tag"], False)
    listed = json.loads(patchbox("env", "list", "--json").stdout)["environments"]
    assert data["id"] in [e["id"] for e in listed]
    shown = patchbox("env", "show", data["id"], "--json")
    assert shown.returncode == 0
    assert json.loads(shown.stdout)["spec"]["inputs"] == ["req.txt"]
    image = docker_client.images.get(data["tag"])
    out = docker_client.containers.run(image.id or "", entrypoint=["cat", "/opt/m"], remove=True)
    assert out.decode().strip() == marker
    unknown = patchbox("env", "show", "0000000000000000", "--json")
    assert (unknown.returncode, json.loads(unknown.stdout)["error"]["code"]) == (2, "USAGE_ERROR")
    no_env = tmp_path / "none.json"
    no_env.write_text(json.dumps({"prompt": "p"}))
    refused = patchbox("env", "build", "--task", str(no_env), "--repo", str(repo), "--json")
    assert (refused.returncode, json.loads(refused.stdout)["error"]["code"]) == (2, "USAGE_ERROR")
    pruned = patchbox("env", "prune", "--json")
    assert pruned.returncode == 0
    assert data["id"] in json.loads(pruned.stdout)["removed"]
    with pytest.raises(docker.errors.ImageNotFound):
        docker_client.images.get(data["tag"])
