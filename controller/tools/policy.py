"""Which workspace paths a tool may write (docs/architecture.md, "Protected paths"), as pure
functions.

Never written (nor read): ``.git`` in any component, ``.env*``, keys and credentials. That
list is the agent's own (``patchbox_agent.protected``), imported here rather than copied, so
the diff check and the agent's jail can never disagree. Written only when the task names
them in ``allowed_paths``: files that make tools run code or change how git reads the tree.
Names are compared after Unicode NFC and case folding.
"""

from __future__ import annotations

from collections.abc import Iterable

from patchbox_agent import jail, protected
from patchbox_agent.globs import Glob

# The very objects the agent's jail uses (a test asserts identity, not equality).
NEVER_NAMES = protected.NAMES
NEVER_PREFIXES = protected.PREFIXES
NEVER_SUFFIXES = protected.SUFFIXES
NEVER_PAIRS = protected.PAIRS

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
    """NFC, then case folding: the agent's comparison form."""
    return protected.fold(path)


def never_touch(path: str) -> bool:
    """Protected for reading and writing alike: the agent's own rule, on the whole path
    (one component, or a (directory, name) pair such as ``.docker/config.json``)."""
    return protected.is_protected_path(path)


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
        return jail.NOT_ALLOWED  # the sandbox's own answer for a protected name
    if allowed_paths is not None and not _allowed(path, allowed_paths):
        return "outside the task's allowed_paths"
    if is_config(path) and not (allowed_paths is not None and _allowed(path, allowed_paths)):
        return "a configuration path that the task does not name in allowed_paths"
    return None
