"""An environment's setup steps reach the network only through a proxy of their own, and
only the pairs of the environment's ``egress`` (or the operator's ``network.setup_default``):
a real build that installs from the package index through the proxy with the
``python-packages`` preset, and fails naming the index's host when the preset is removed;
no egress, no network at all; an entry the operator does not allow refused before anything
is built. The package hosts are read at run time (``tests.support.registries``)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import docker
import pytest

from controller.sandbox import environment as envmod
from controller.sandbox.labels import OWNER_FILTER
from tests.support.cli import job_files, patchbox
from tests.support.git import init
from tests.support.registries import package_hosts, pip_hosts

NETWORK_BUILD = 900
"""Seconds a build that installs from the network may take."""
DIRECT = (
    'python3 -c "import socket; s = socket.socket(); s.settimeout(3); '
    "print(s.connect_ex(('198.51.100.7', 80)))\" > /opt/direct"
)
"""A setup step that ignores the proxy variables and dials an outside address."""


def _config(folder: Path, *, setup_default: str = "") -> Path:
    """Package hosts allowed, in the presets ``debian`` and ``python-packages``."""
    hosts = list(package_hosts())
    pip = pip_hosts()
    debian = [h for h in hosts if h not in pip]
    text = (
        f"[network]\nallow = {json.dumps([*hosts, 'files.example.test:8000'])}\n"
        f"{setup_default}"
        f"[network.presets]\ndebian = {json.dumps(debian)}\n"
        f"python-packages = {json.dumps(pip)}\n"
    )
    path = folder / "config.toml"
    path.write_text(text)
    return path


def _build(
    folder: Path, repo: Path, environment: dict[str, Any], config: Path
) -> tuple[int, dict[str, Any], str]:
    (folder / "task.json").write_text(json.dumps({"prompt": "p", "environment": environment}))
    proc = patchbox(
        "env",
        "build",
        "--task",
        str(folder / "task.json"),
        "--repo",
        str(repo),
        "--config",
        str(config),
        "--json",
        timeout=NETWORK_BUILD,
    )
    return proc.returncode, json.loads(proc.stdout or "{}"), proc.stderr


def _left(client: docker.DockerClient) -> list[str]:
    """Setup proxies and their networks still there (a setup's are named
    ``patchbox-setup-*``; a check's, of other tests, ``patchbox-egress-*``)."""
    containers = client.containers.list(all=True, filters={"label": OWNER_FILTER}, sparse=True)
    names = [str(c.attrs.get("Names") or c.name or "") for c in containers]
    found = [f"container {n}" for n in names if "patchbox-setup-" in n]
    networks = client.networks.list(filters={"label": OWNER_FILTER})
    return found + [
        f"network {n.name}" for n in networks if (n.name or "").startswith("patchbox-setup-")
    ]


def _read(client: docker.DockerClient, tag: str, path: str) -> str:
    out = client.containers.run(tag, entrypoint=["cat", path], remove=True, network_disabled=True)
    return out.decode().strip() if isinstance(out, bytes) else str(out)


@pytest.mark.docker
@pytest.mark.timeout(2 * NETWORK_BUILD)
def test_a_setup_installs_from_the_package_index_through_the_proxy_and_names_it_when_refused(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    del sandbox_image
    repo = init(tmp_path / "p", {"a.txt": "a\n"}).path
    config = _config(tmp_path)
    marker = uuid.uuid4().hex
    install = [
        "python3",
        "-m",
        "pip",
        "install",
        "--no-cache-dir",
        "--break-system-packages",
        "--retries",
        "1",
        "--timeout",
        "30",
        "iniconfig==2.0.0",
    ]
    setup = [
        ["sh", "-c", f"echo {marker} > /opt/m"],
        [
            "sh",
            "-c",
            "apt-get update -q && apt-get install -y -q --no-install-recommends python3-pip",
        ],
        install,
        ["sh", "-c", DIRECT],
    ]
    full = {"setup": setup, "egress": ["preset:debian", "preset:python-packages"]}
    code, data, stderr = _build(tmp_path, repo, full, config)
    assert code == 0, stderr[-4000:]
    tag = data["tag"]
    try:
        out = docker_client.containers.run(
            tag,
            entrypoint=["python3", "-c", "import iniconfig, os; print(iniconfig.__name__)"],
            remove=True,
            network_disabled=True,
        )
        assert out.decode().strip() == "iniconfig"
        assert _read(docker_client, tag, "/opt/direct") != "0"  # nothing but the proxy
        # what the proxy saw: the index's hosts and the mirror, allowed, with their bytes
        seen = {(r["host"], r["port"]) for r in data["network"] if r["allowed"]}
        for pair in pip_hosts():
            host, port = pair.rsplit(":", 1)
            assert (host, int(port)) in seen, data["network"]
        assert all(r["bytes_in"] > 0 for r in data["network"] if r["allowed"])
        assert not [r for r in data["network"] if not r["allowed"]]
        assert data["egress"] == [
            *(h for h in package_hosts() if h not in pip_hosts()),
            *pip_hosts(),
        ]
        # the proxy variables were build arguments: not in the image
        image_env = docker_client.images.get(tag).attrs["Config"].get("Env") or []
        assert not [v for v in image_env if "proxy" in v.split("=", 1)[0].lower()], image_env
    finally:
        docker_client.images.remove(tag, force=True)
    assert not _left(docker_client)

    # the python-packages preset removed: the install fails, naming the index's host
    less = {"setup": setup, "egress": ["preset:debian"]}
    code, data, stderr = _build(tmp_path, repo, less, config)
    assert code == 1, stderr[-4000:]
    error = data["error"]
    assert error["code"] == "ENVIRONMENT_BUILD_FAILED"
    assert "at setup 3/4: python3 -m pip install" in error["message"]
    index = pip_hosts()[0]
    assert (
        f"the egress proxy refused: {index} (not in the environment's egress)" in (error["message"])
    ), error["message"]
    assert not _left(docker_client)
    assert not [
        t
        for image in docker_client.images.list(filters={"label": "io.patchbox.kind=environment"})
        for t in image.tags
        if marker in image.labels.get(envmod.LABEL_SPEC, "")
    ]


@pytest.mark.docker
@pytest.mark.timeout(2 * NETWORK_BUILD)
def test_without_egress_a_setup_has_no_network_and_with_egress_only_the_proxy(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    """No ``egress`` and no ``setup_default``, or ``egress = []`` under a ``setup_default``:
    the steps see the loopback interface only. With egress: one more interface, the proxy
    variables set for the steps, and a dial that ignores them reaches nothing."""
    del sandbox_image
    repo = init(tmp_path / "p", {"a.txt": "a\n"}).path
    marker = uuid.uuid4().hex
    script = (  # one step (each step is a layer): interfaces, proxy variables, a direct dial
        "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | tr '\\n' ' ' > /opt/probe"
        " && echo >> /opt/probe"
        " && { env | grep -ci '^https_proxy=http://' >> /opt/probe || true; }"
        f" && {DIRECT.replace('> /opt/direct', '>> /opt/probe')} # {marker}"
    )
    probe = [["sh", "-c", script]]
    cases: list[tuple[str, dict[str, Any], str]] = [
        ("none", {"setup": probe}, ""),
        ("empty", {"setup": probe, "egress": []}, 'setup_default = ["preset:debian"]\n'),
        ("declared", {"setup": probe, "egress": ["files.example.test:8000"]}, ""),
        ("default", {"setup": probe}, 'setup_default = ["files.example.test:8000"]\n'),
    ]
    keys: dict[str, str] = {}
    for name, environment, default in cases:
        folder = tmp_path / name
        folder.mkdir()
        code, data, stderr = _build(
            folder, repo, environment, _config(folder, setup_default=default)
        )
        assert code == 0, (name, stderr[-3000:])
        keys[name] = data["key"]
        try:
            lines = _read(docker_client, data["tag"], "/opt/probe").splitlines()
            assert len(lines) == 3, (name, lines)
            nets, proxied = lines[0].split(), lines[1]
            assert lines[2] != "0", name
        finally:
            docker_client.images.remove(data["tag"], force=True)
        if name in {"none", "empty"}:
            assert (nets, proxied, data["egress"]) == (["lo"], "0", []), name
        else:
            assert len(nets) == 2, (name, nets)
            assert "lo" in nets, (name, nets)
            assert proxied == "2", name  # HTTPS_PROXY and https_proxy
            assert data["egress"] == ["files.example.test:8000"], name
    # the pairs the setup could reach are part of the image's key (and tag)
    assert keys["none"] == keys["empty"] != keys["declared"] == keys["default"]
    assert not _left(docker_client)


@pytest.mark.docker
def test_an_environment_egress_the_operator_does_not_allow_is_refused_before_any_build(
    docker_client: docker.DockerClient, sandbox_image: str, runtime: str, tmp_path: Path
) -> None:
    """``env build`` and ``run`` (under either runtime) end ``EGRESS_NOT_ALLOWED`` naming
    the entry: no image, no proxy, no network, no container of the job."""
    del sandbox_image
    repo = init(tmp_path / "p", {"a.txt": "a\n"}).path
    marker = uuid.uuid4().hex
    environment = {
        "setup": [["sh", "-c", f"echo {marker}"]],
        "egress": ["preset:debian", "evil.example.net:443"],
    }
    config = _config(tmp_path)
    code, data, _stderr = _build(tmp_path, repo, environment, config)
    assert code == 2
    assert data["error"]["code"] == "EGRESS_NOT_ALLOWED"
    assert "environment.egress declares" in data["error"]["message"]
    assert "evil.example.net:443" in data["error"]["message"]
    task = {"prompt": "p", "environment": environment}
    args = job_files(tmp_path / "job", task, {"turns": [], "final": "done"}, config.read_text())
    home = tmp_path / "home"
    proc = patchbox("run", "--repo", str(repo), *args, "--runtime", runtime, "--json", home=home)
    assert proc.returncode == 2, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["error"]["code"] == "EGRESS_NOT_ALLOWED"
    assert "evil.example.net:443" in out["error"]["message"]
    assert out["status"] == "failed"  # the job's record says why; nothing of it started
    assert not docker_client.containers.list(
        all=True, filters={"label": f"io.patchbox.job={out['job_id']}"}, sparse=True
    )
    assert not _left(docker_client)
    assert not [
        image
        for image in docker_client.images.list(filters={"label": "io.patchbox.kind=environment"})
        if marker in image.labels.get(envmod.LABEL_SPEC, "")
    ]
