"""Which workspace paths a tool may write (SPEC 5.7), as pure functions.

Never written (nor read): ``.git`` in any component, ``.env*``, keys and credentials. Written
only when the task names them in ``allowed_paths``: files that make tools run code or change
how git reads the tree. Names are compared after Unicode NFC and case folding.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable

from patchbox_agent.globs import Glob

NEVER_NAMES = frozenset({".git", ".npmrc", ".pypirc", ".netrc", ".git-credentials", ".dockercfg"})
NEVER_PREFIXES = (".env", "id_rsa", "id_dsa", "id_ecdsa", "id_ed25519")
NEVER_SUFFIXES = (".pem", ".key", ".p12", ".pfx", ".keystore", ".jks")

CONFIG_NAMES = frozenset(
    {
        ".gitattributes",
        ".gitmodules",
        ".gitignore",
        ".mailmap",
        ".lfsconfig",
        ".gitlab-ci.yml",
        ".travis.yml",
        "jenkinsfile",
        "azure-pipelines.yml",
        ".envrc",
        ".pre-commit-config.yaml",
        "makefile",
        "package.json",
        "package-lock.json",
        "yarn.lock",
        "pnpm-lock.yaml",
        "poetry.lock",
        "pipfile",
        "pipfile.lock",
        "uv.lock",
        "cargo.lock",
        "go.sum",
        "gemfile.lock",
        "composer.lock",
        "setup.cfg",
        "setup.py",
        "pyproject.toml",
        "tox.ini",
        "noxfile.py",
        "conftest.py",
        "pytest.ini",
        ".npmrc",
        ".yarnrc",
        ".yarnrc.yml",
        "requirements.txt",
    }
)
CONFIG_DIRS = frozenset(
    {
        ".github",
        ".circleci",
        ".husky",
        ".githooks",
        ".devcontainer",
        ".vscode",
        ".idea",
        "node_modules",
        "vendor",
        ".venv",
        "venv",
        "site-packages",
    }
)


def fold(path: str) -> str:
    return unicodedata.normalize("NFC", path).casefold()


def never_touch(path: str) -> bool:
    """Protected for reading and writing alike."""
    return any(
        part in NEVER_NAMES or part.startswith(NEVER_PREFIXES) or part.endswith(NEVER_SUFFIXES)
        for part in fold(path).split("/")
    )


def is_config(path: str) -> bool:
    """Written only when ``allowed_paths`` names it."""
    parts = fold(path).split("/")
    return parts[-1] in CONFIG_NAMES or any(p in CONFIG_DIRS for p in parts[:-1])


def _allowed(path: str, allowed: Iterable[str]) -> bool:
    folded = fold(path)
    for entry in allowed:
        e = fold(entry).rstrip("/")
        if folded == e or folded.startswith(e + "/"):
            return True
    return False


def write_denial(
    path: str, allowed_paths: list[str] | None, extra_protected: Iterable[str] = ()
) -> str | None:
    """Why ``path`` may not be written, or None when it may. ``extra_protected`` are the
    operator's globs, matched as the agent matches them (folded, whole path)."""
    if never_touch(path) or any(Glob(fold(g))(fold(path)) for g in extra_protected):
        return "protected path"
    if allowed_paths is not None and not _allowed(path, allowed_paths):
        return "outside the task's allowed_paths"
    if is_config(path) and not (allowed_paths is not None and _allowed(path, allowed_paths)):
        return "a configuration path that the task does not name in allowed_paths"
    return None
