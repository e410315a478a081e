"""Credential files: one protected list, shared by the agent's jail and the controller's write
policy, and every tool refusing those files on the real agent (over pipes, and in a
container under runc and under gVisor)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.errors import ErrorCode, ToolError
from controller.sandbox.local import LocalSandbox
from controller.tools import policy
from controller.tools.executor import ToolExecutor
from patchbox_agent import jail, protected
from tests.conftest import SandboxFactory, _require_runsc
from tests.support.harness import AgentWorkspace


def test_the_controller_uses_the_agents_very_list() -> None:
    """Identity, not equality: an entry added on one side is on the other."""
    assert policy.NEVER_NAMES is protected.NAMES
    assert policy.NEVER_PREFIXES is protected.PREFIXES
    assert policy.NEVER_SUFFIXES is protected.SUFFIXES
    assert policy.NEVER_PAIRS is protected.PAIRS
    assert jail._PROTECTED_NAMES is protected.NAMES
    assert jail._PROTECTED_PREFIXES is protected.PREFIXES
    assert jail._PROTECTED_SUFFIXES is protected.SUFFIXES


def test_entries_are_already_folded() -> None:
    """Lookups fold the path, never the entries: an entry that is not in folded form
    would never match anything."""
    names = [*protected.NAMES, *protected.PREFIXES, *protected.SUFFIXES]
    names += [part for pair in protected.PAIRS for part in pair]
    assert [n for n in names if protected.fold(n) != n or "/" in n] == []


# (path, protected?): the same answer from the host's never_touch and the agent's jail.
TABLE: list[tuple[str, bool]] = [
    (".git/config", True),
    ("sub/.GIT/HEAD", True),
    (".git-credentials", True),
    ("sub/.npmrc", True),
    (".NPMRC", True),
    (".pypirc", True),
    (".netrc", True),
    ("_netrc", True),
    (".dockercfg", True),
    (".docker/config.json", True),
    ("home/.Docker/Config.JSON", True),
    (".aws/credentials", True),
    (".aws/config", True),
    (".kube/config", True),
    (".cargo/credentials.toml", True),
    (".config/gh/hosts.yml", True),
    (".ssh/known_hosts", True),
    (".gnupg/pubring.kbx", True),
    ("keys/server.p12", True),
    ("site.pfx", True),
    ("x.jks", True),
    ("release.keystore", True),
    ("tls/server.pem", True),
    ("tls/server.key", True),
    ("putty.ppk", True),
    ("vault.kdbx", True),
    ("backup.tar.gpg", True),
    ("infra/terraform.tfstate", True),
    ("infra/terraform.tfstate.backup", True),
    (".env", True),
    (".env.local", True),
    (".envrc", True),
    ("id_rsa", True),
    ("id_ed25519.pub", True),
    (".pgpass", True),
    (".my.cnf", True),
    ("public/.htpasswd", True),
    (".boto", True),
    (".s3cfg", True),
    (".vault-token", True),
    ("credentials.json", True),
    ("gcloud/application_default_credentials.json", True),
    # The same words where a project keeps its everyday files: never protected.
    ("config.json", False),
    ("src/config.json", False),
    ("docker/config.json", False),
    (".docker/Dockerfile", False),
    ("config.json/.docker", False),
    (".aws/README.md", False),
    ("aws/credentials", False),
    ("src/credentials.py", False),
    (".kube/config.example", False),
    ("hosts.yml", False),
    ("keys.py", False),
    ("monkey.py", False),
    ("environment.yml", False),
    ("src/keystore.py", False),
    ("README.md", False),
    ("package.json", False),
]


@pytest.mark.parametrize(("path", "expected"), TABLE, ids=[p for p, _ in TABLE])
def test_host_and_agent_give_the_same_answer(path: str, expected: bool) -> None:
    assert policy.never_touch(path) is expected
    assert protected.is_protected_path(path) is expected
    if expected:
        with pytest.raises(jail.PathDeniedError):
            jail.split(path)
        assert policy.write_denial(path, None) == "protected path"
    else:
        assert jail.split(path) == path.split("/")


def test_case_folding_is_unicode_case_folding() -> None:
    """KELVIN SIGN folds to k and LONG S to s: spellings a byte compare would miss."""
    assert policy.never_touch(".\u212aube/config")
    assert policy.never_touch(".\u017fsh/id_ecdsa_sk")
    assert policy.never_touch("\u017fub/.DOCKER/CONFIG.JSON")
    for path in (".\u212aube/config", ".\u017fsh/x", ".DOCKER/CONFIG.JSON"):
        with pytest.raises(jail.PathDeniedError):
            jail.split(path)


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
    assert info.value.message == "path denied"


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
