"""Building the sandbox image: caching by content, any python3 base, and the local base."""

from __future__ import annotations

import io
import shutil
import subprocess
import time
from pathlib import Path

import docker
import pytest

from controller.config.limits import Limits
from controller.paths import patchbox_home
from controller.sandbox import image as image_mod
from controller.sandbox.base import SandboxSpec
from controller.sandbox.docker import DockerSandbox
from controller.sandbox.image import LOCAL_BASE_REPO, ImageBuilder, recipe_hash
from controller.sandbox.labels import current_identity, new_job_id


@pytest.mark.docker
def test_second_build_is_a_cache_hit(
    docker_client: docker.DockerClient, sandbox_image: str
) -> None:
    started = time.monotonic()
    info = ImageBuilder(docker_client).ensure()
    assert info.tag == sandbox_image
    assert info.built is False
    assert time.monotonic() - started < 5
    labels = docker_client.images.get(info.tag).labels
    assert labels["io.patchbox.owner"] == "patchbox"


@pytest.mark.docker
def test_any_python3_base_works(docker_client: docker.DockerClient, sandbox_image: str) -> None:
    """A base that is not the default gets its own image tag and a working agent."""
    local = f"{LOCAL_BASE_REPO}:{recipe_hash()}"
    if not docker_client.images.list(name=local):
        pytest.fail("the local base image should exist after the session build on this machine")
    other = "patchbox-test-base:other"
    dockerfile = f"FROM {local}\nRUN echo other > /etc/other-base\n"
    docker_client.images.build(
        fileobj=io.BytesIO(dockerfile.encode()),
        tag=other,
        rm=True,
        labels={"io.patchbox.owner": "patchbox"},
    )
    built_tag = ""
    try:
        info = ImageBuilder(docker_client).ensure(base=other)
        built_tag = info.tag
        assert info.base == other
        assert info.base_source == "present"
        assert info.tag != sandbox_image
        spec = SandboxSpec(
            image=info.tag, job_id=new_job_id(), limits=Limits(memory_mb=512, workspace_mb=128)
        )
        with DockerSandbox.start(docker_client, spec, current_identity()) as box:
            assert box.run(["cat", "/etc/other-base"], timeout=20).output == "other\n"
    finally:
        for tag in (built_tag, other):
            if tag:
                docker_client.images.remove(tag, force=True)


@pytest.mark.docker
def test_debootstrap_is_fetched_when_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without debootstrap on PATH, Debian's package is unpacked into the state directory."""
    real_which = shutil.which
    monkeypatch.setattr(
        shutil,
        "which",
        lambda name, path=None: None if name == "debootstrap" else real_which(name, path=path),
    )
    found = image_mod._find_debootstrap(lambda _m: None)
    script = Path(found.argv[0])
    assert script.is_relative_to(patchbox_home())
    assert script.is_file()
    assert Path(found.env["DEBOOTSTRAP_DIR"], "scripts", "bookworm").exists()
    out = subprocess.run(
        [*found.argv, "--version"], env=found.env, capture_output=True, text=True, check=False
    )
    assert out.stdout.startswith("debootstrap ")


@pytest.mark.docker
def test_local_base_from_scratch(
    docker_client: docker.DockerClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The no-registry path end to end: debootstrap, docker import, a python3 that runs."""
    monkeypatch.setattr(image_mod, "LOCAL_BASE_REPO", "patchbox-test-base")
    tag = f"patchbox-test-base:{recipe_hash()}"
    if docker_client.images.list(name=tag):
        docker_client.images.remove(tag, force=True)
    try:
        assert ImageBuilder(docker_client).build_local_base() == tag
        img = docker_client.images.get(tag)
        assert img.labels["io.patchbox.recipe"] == recipe_hash()
        out = docker_client.containers.run(
            tag,
            ["python3", "-c", "import sys; print(sys.version_info >= (3, 9))"],
            remove=True,
            network_mode="none",
            labels=current_identity().labels("image-test", "probe"),
        )
        assert out.strip() == b"True"
        assert not list((patchbox_home() / "tmp").glob("base-*")), (
            "the rootfs folder must be removed"
        )
    finally:
        if docker_client.images.list(name=tag):
            docker_client.images.remove(tag, force=True)
