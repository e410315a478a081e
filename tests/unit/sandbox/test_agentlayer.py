"""The agent layer read from the sandbox Dockerfile and packed as one archive: the real
Dockerfile parses, a line that cannot be replayed in one commit is refused, and the archive
holds the agent's files root-owned at their targets, without bytecode caches."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from controller.errors import EnvironmentBuildError
from controller.paths import sandbox_image_dir
from controller.sandbox import agentlayer
from controller.sandbox.environment import agent_layer


def test_the_sandbox_dockerfile_s_agent_layer_parses() -> None:
    layer = agentlayer.parse(agent_layer())
    assert layer.copies == (
        ("agent.py", "/opt/patchbox/agent.py"),
        ("patchbox_agent", "/opt/patchbox/patchbox_agent"),
    )
    assert "compileall" in layer.run
    assert "\\" not in layer.run  # continued lines joined
    words = [change.split()[0] for change in layer.changes]
    assert words == ["ENV", "USER", "WORKDIR", "ENTRYPOINT"]
    assert layer.changes[-1].endswith('"/opt/patchbox/agent.py"]')


@pytest.mark.parametrize(
    "text",
    [
        "COPY a /a\nRUN true\nVOLUME /x\n",  # not a config change
        "COPY a /a\nRUN true\nRUN false\n",  # two RUN lines
        "COPY a /a\nUSER 1\n",  # no RUN
        'COPY a /a\nRUN ["true"]\n',  # exec form
        "COPY --chown=1 a /a\nRUN true\n",  # COPY options
        "COPY a b /c/\nRUN true\n",  # several sources
        "RUN true\nCOPY a /a\n",  # COPY after RUN
        "ADD a /a\nRUN true\n",
    ],
)
def test_a_layer_that_cannot_be_replayed_in_one_commit_is_refused(text: str) -> None:
    with pytest.raises(EnvironmentBuildError):
        agentlayer.parse(text)


def test_the_archive_holds_the_agent_at_its_targets_without_caches(tmp_path: Path) -> None:
    (tmp_path / "pkg" / "__pycache__").mkdir(parents=True)
    (tmp_path / "pkg" / "mod.py").write_text("x = 1\n")
    (tmp_path / "pkg" / "__pycache__" / "mod.cpython-311.pyc").write_bytes(b"\0")
    (tmp_path / "run.sh").write_text("#!/bin/sh\n")
    (tmp_path / "run.sh").chmod(0o755)
    layer = agentlayer.parse("COPY pkg /opt/p/pkg\nCOPY run.sh /opt/p/\nRUN true\n")
    data = agentlayer.archive(layer, tmp_path, mtime=1234)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert set(members) == {"opt", "opt/p", "opt/p/pkg", "opt/p/pkg/mod.py", "opt/p/run.sh"}
        assert all(m.uid == 0 and m.gid == 0 and m.mtime == 1234 for m in members.values())
        assert members["opt/p/run.sh"].mode == 0o755
        assert members["opt/p/pkg/mod.py"].mode == 0o644
        assert members["opt/p"].isdir()
        body = tar.extractfile("opt/p/pkg/mod.py")
        assert body is not None
        assert body.read() == b"x = 1\n"


def test_the_real_agent_is_archived_whole() -> None:
    layer = agentlayer.parse(agent_layer())
    with tarfile.open(fileobj=io.BytesIO(agentlayer.archive(layer, sandbox_image_dir(), 0))) as tar:
        names = set(tar.getnames())
    assert "opt/patchbox/agent.py" in names
    expected = {
        f"opt/patchbox/patchbox_agent/{p.name}"
        for p in (sandbox_image_dir() / "patchbox_agent").glob("*.py")
    }
    assert expected
    assert expected <= names
    assert not [n for n in names if "__pycache__" in n]
