"""Credential files: one protected list, shared by the agent's jail and the controller's write
policy, and every tool refusing those files on the real agent (over pipes, and in a
container under runc and under gVisor)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.errors import ErrorCode, ToolError
from controller.sandbox.local import LocalSandbox
from controller.tools.executor import ToolExecutor
from tests.support.harness import AgentWorkspace
from tests.support.sandbox import SandboxFactory, _require_runsc

# --- attacks on the real agent ---------------------------------------------------------------

PAYLOAD = "needle SECRET-VALUE"
CREDENTIALS = [
    ".git-credentials",
    "sub/.npmrc",
    ".docker/config.json",
    ".aws/credentials",
    ".aws/config",
    ".kube/config",
    ".ssh/known_hosts",
    "keys/server.p12",
    "x.jks",
    "release.keystore",
    "certs/site.pfx",
    ".env.local",
    "db/.pgpass",
    ".htpasswd",
    "credentials.json",
    "infra/prod.tfstate",
]
VISIBLE = ["a.txt", "config.json", "docker/config.json", "src/credentials.py"]


@pytest.fixture(
    params=[
        "local",
        pytest.param("runc", marks=pytest.mark.docker),
        pytest.param("runsc", marks=pytest.mark.docker),
    ]
)
def cred_ws(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[AgentWorkspace]:
    """A workspace holding each credential file next to ordinary ones, served by the agent
    over pipes or in a container under each runtime."""
    files: dict[str, bytes | str] = dict.fromkeys(CREDENTIALS, PAYLOAD + "\n")
    files.update(dict.fromkeys(VISIBLE, "needle\n"))
    if request.param == "local":
        root = tmp_path / "ws"
        root.mkdir()
        (tmp_path / "outside").mkdir()
        with LocalSandbox(root) as box:
            ws = AgentWorkspace("local", box, root, str(tmp_path / "outside"))
            ws.setup(files)
            yield ws
        return
    else:
        if request.param == "runsc" and not request.getfixturevalue("runsc_available"):
            if _require_runsc():
                pytest.fail("runsc is not registered with the Docker daemon (required under CI)")
            pytest.skip("runsc is not registered with the Docker daemon")
        make: SandboxFactory = request.getfixturevalue("make_sandbox")
        sandbox = make(runtime=request.param)
        ws = AgentWorkspace("docker", sandbox, Path("/workspace"), "/tmp/outside")
    ws.setup(files)
    yield ws


def test_credentials_are_never_listed_or_searched(cred_ws: AgentWorkspace) -> None:
    box = cred_ws.box
    assert box.list_files().files == sorted(VISIBLE)
    found = box.search_text("needle")
    assert sorted({h.path for h in found.hits}) == sorted(VISIBLE)
    assert "SECRET" not in found.model_dump_json()
    assert box.search_text("SECRET-VALUE").hits == []
    assert box.search_text("S.CRET", regex=True).hits == []


@pytest.mark.parametrize("path", CREDENTIALS)
def test_credentials_are_never_read(cred_ws: AgentWorkspace, path: str) -> None:
    with pytest.raises(ToolError) as info:
        cred_ws.box.read_file(path)
    assert info.value.code is ErrorCode.TOOL_PATH_DENIED
    assert info.value.message == "not allowed"


def test_credentials_are_never_written(cred_ws: AgentWorkspace) -> None:
    box = cred_ws.box
    before = cred_ws.files()
    ex = ToolExecutor(box)
    for n, path in enumerate(CREDENTIALS):
        with pytest.raises(ToolError) as info:
            box.replace_text(path, "SECRET-VALUE", "owned")
        assert info.value.code is ErrorCode.TOOL_PATH_DENIED, path
        patch = (
            f"diff --git a/{path} b/{path}\n--- a/{path}\n+++ b/{path}\n"
            f"@@ -1 +1 @@\n-{PAYLOAD}\n+owned\n"
        )
        with pytest.raises(ToolError) as info:
            box.apply_patch(patch)
        assert info.value.code is ErrorCode.PATCH_REJECTED, path
        for tool, args in (
            ("replace_text", {"path": path, "oldText": "SECRET-VALUE", "newText": "owned"}),
            ("apply_patch", {"patch": patch}),
        ):
            out = ex.execute(1, f"{tool}-{n}", tool, args)
            assert out.error is not None, (tool, path)
            assert out.error["code"] == "TOOL_PATH_DENIED", (tool, path)
    created = "diff --git a/new/.aws/credentials b/new/.aws/credentials\nnew file mode 100644\n"
    created += "--- /dev/null\n+++ b/new/.aws/credentials\n@@ -0,0 +1 @@\n+planted\n"
    with pytest.raises(ToolError):
        box.apply_patch(created)
    assert cred_ws.files() == before
