"""Credential files: one protected list, shared by the agent's jail and the controller's write
policy, and every tool refusing those files on the real agent (over pipes, and in a
container under runc and under gVisor)."""

from __future__ import annotations

import pytest

from controller.tools import policy
from patchbox_agent import jail, protected


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
        assert policy.write_denial(path, None) == "not allowed"
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
