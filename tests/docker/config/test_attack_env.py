"""Variables that run code or carry a secret, given where a task, a check, the host
configuration or the repository's suggested checks set variables: each is refused with
``USAGE_ERROR`` naming the variable and never its value, from the CLI and over HTTP, before
anything starts. An environment image built with variables keeps their values out of its
labels and out of ``patchbox env list`` / ``env show``."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import docker
import docker.errors
import pytest

from controller.sandbox import environment as envmod
from tests.support.cli import job_files, patchbox
from tests.support.git import init
from tests.support.jobs import make_repo

# -- the front doors: nothing starts -------------------------------------------------------


@pytest.mark.docker
def test_a_code_variable_in_a_check_is_refused_before_any_sandbox(
    docker_client: docker.DockerClient, sandbox_image: str, runtime: str, tmp_path: Path
) -> None:
    """A check whose env preloads a library from the workspace (that the model could write)
    ends ``USAGE_ERROR`` at once under either runtime: no job, no container."""
    del sandbox_image
    repo = make_repo(tmp_path / "repo")
    home = tmp_path / "home"
    task = {
        "prompt": "p",
        "checks": {"c": {"argv": ["true"], "env": {"LD_PRELOAD": "/workspace/evil-v4lue.so"}}},
    }
    args = job_files(tmp_path / "job", task, {"turns": [], "final": "done"})
    proc = patchbox("run", "--repo", str(repo), *args, "--runtime", runtime, "--json", home=home)
    assert proc.returncode == 2, proc.stderr[-2000:]
    error = json.loads(proc.stdout)["error"]
    assert error["code"] == "USAGE_ERROR"
    assert (
        "environment variable LD_PRELOAD makes programs load or run other code"
        in (error["message"])
    )
    assert "v4lue" not in proc.stdout + proc.stderr
    jobs = home / "jobs"
    assert not jobs.exists() or not any(jobs.iterdir())  # no job: nothing to start a sandbox for


@pytest.mark.docker
def test_an_environment_image_labels_names_and_never_values(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    """A real build with two variables: the setup sees both values; the image's labels,
    ``env list`` and ``env show`` (text and JSON) hold their names and no value."""
    del sandbox_image
    repo = init(tmp_path / "p", {"a.txt": "a\n"}).path
    marker = uuid.uuid4().hex
    values = {"MODE": f"mode-{marker}-v4lue", "DATABASE_URL": f"postgres://app@db/{marker}v4lue"}
    task = {
        "prompt": "p",
        "environment": {
            "setup": [["sh", "-c", f'echo "$MODE $DATABASE_URL" > /opt/m # {marker}']],
            "env": values,
        },
    }
    (tmp_path / "task.json").write_text(json.dumps(task))
    built = patchbox("env", "build", "--task", str(tmp_path / "task.json"), "--repo", str(repo))
    assert built.returncode == 0, built.stderr[-3000:]
    tag = next(t for t in _tags(docker_client, marker))
    try:
        image = docker_client.images.get(tag)
        labels = image.labels
        assert set(labels) >= {envmod.LABEL_KEY, envmod.LABEL_SPEC, envmod.LABEL_BASE}
        assert "v4lue" not in json.dumps(labels)
        assert json.loads(labels[envmod.LABEL_SPEC])["env"] == ["DATABASE_URL", "MODE"]
        assert len(labels[envmod.LABEL_KEY]) == 64
        seen = docker_client.containers.run(
            image.id or "", entrypoint=["cat", "/opt/m"], remove=True
        )
        assert seen.decode().split() == [values["MODE"], values["DATABASE_URL"]]
        env_id = tag.split(":", 1)[1]
        shown = patchbox("env", "show", env_id, "--json")
        assert json.loads(shown.stdout)["spec"]["env"] == ["DATABASE_URL", "MODE"]
        text = patchbox("env", "show", env_id)
        assert "env: DATABASE_URL\nenv: MODE" in text.stdout
        listed = patchbox("env", "list", "--json")
        for out in (shown.stdout, text.stdout, listed.stdout):
            assert "v4lue" not in out
    finally:
        docker_client.images.remove(tag, force=True)


def _tags(client: docker.DockerClient, marker: str) -> list[str]:
    found = client.images.list(filters={"label": "io.patchbox.kind=environment"})
    return [
        t
        for image in found
        if marker in image.labels.get(envmod.LABEL_SPEC, "")
        for t in image.tags
    ]
