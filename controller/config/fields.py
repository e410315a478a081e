"""What configuration blocks share: the variables a process gets (names and values that
are refused: secrets, proxies, code loaders, credentials) and an image reference."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import StringConstraints

from controller.logs import SECRET_NAME

ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]{0,63}$")
_PROXY_NAME = re.compile(r"(?i)_proxy$")
ImageRef = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._/:@+-]{0,254}$")]
"""An image reference as Docker spells it: ``[host[:port]/]path[:tag][@digest]``."""


CODE_VARIABLES = frozenset({
    # shells: startup files, hooks and parsing every shell applies
    "BASH_ENV", "ENV", "ZDOTDIR", "PROMPT_COMMAND", "PS4", "SHELLOPTS", "BASHOPTS", "IFS",
    # the C library: character-set modules loaded as shared objects, OpenSSL's engines
    "GCONV_PATH", "OPENSSL_CONF", "OPENSSL_ENGINES", "OPENSSL_MODULES",
    # where every program reads its user configuration (git's, npm's, Python's user site)
    "HOME", "XDG_CONFIG_HOME",
    # interpreters: startup code, another standard library, options that load modules
    "PYTHONSTARTUP", "PYTHONHOME", "PYTHONINSPECT", "PYTHONUSERBASE", "PYTHONPLATLIBDIR",
    "PYTHONBREAKPOINT", "PERL5OPT", "PERL5DB", "RUBYOPT",
    "JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS", "JDK_JAVA_OPTIONS",
    # commands that tools run on their own
    "EDITOR", "VISUAL", "PAGER", "BROWSER", "LESSOPEN", "LESSCLOSE", "SSH_ASKPASS",
    "SUDO_ASKPASS",
})  # fmt: skip
"""Variables that make a program load or run code its argv does not name, in every program
of a kind (every shell, every dynamically linked program, every JVM): refused."""
CODE_PREFIXES = ("LD_", "BASH_FUNC_", "GIT_")
"""Prefixes of refused variables: the dynamic loader's (``LD_PRELOAD``, ``LD_AUDIT``,
``LD_LIBRARY_PATH``), exported shell functions, git's (``GIT_CONFIG_*``, ``GIT_SSH_COMMAND``,
``GIT_PROXY_COMMAND``, ``GIT_DIR``), but for :data:`GIT_VARIABLES`."""
GIT_VARIABLES = frozenset({
    "GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_AUTHOR_DATE",
    "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL", "GIT_COMMITTER_DATE",
    "GIT_SSL_CAINFO", "GIT_TERMINAL_PROMPT", "GIT_CEILING_DIRECTORIES", "GIT_LFS_SKIP_SMUDGE",
})  # fmt: skip
"""The git variables allowed: identity, dates, the CA bundle, prompts, discovery's limit."""
NODE_CODE_OPTIONS = frozenset({
    "-r", "--require", "--import", "--loader", "--experimental-loader", "--openssl-config",
})  # fmt: skip
"""Options refused in ``NODE_OPTIONS``: each loads a module or a shared object into every
node process (its other options, such as ``--max-old-space-size``, are allowed)."""

_URL_PASSWORD = re.compile(r"(?i)\b[a-z][a-z0-9+.-]*://[^\s/?#@]*:[^\s/?#@]*@")
_URL_TOKEN = re.compile(r"(?i)\bhttps?://[^\s/?#@:]+@")
_CREDENTIAL_PAIR = re.compile(
    r"(?i)(?:^|[\s;&?,])(?:password|passwd|pwd|pass|passphrase|accountkey|sharedaccesskey|"
    r"sharedaccesssignature|sig|client_secret|access_token|auth_token|api_key|apikey|token|"
    r"secret)\s*=\s*[^\s;&'\"]"
)


def code_variable(name: str) -> bool:
    """Whether ``name`` is one of :data:`CODE_VARIABLES` or :data:`CODE_PREFIXES` (but for
    :data:`GIT_VARIABLES`)."""
    if name in GIT_VARIABLES:
        return False
    return name in CODE_VARIABLES or name.startswith(CODE_PREFIXES)


def credential_in_value(name: str, value: str) -> str | None:
    """What in ``value`` carries a credential or loads code, said without the value: a URL
    with a password (``scheme://user:password@host``), an http(s) URL with a user (a token
    in the user's place), a ``password=`` / ``token=`` pair of a connection string or a
    query, a code-loading option of ``NODE_OPTIONS``; ``None`` when nothing does."""
    if _URL_PASSWORD.search(value):
        return "a URL with a password (scheme://user:password@host)"
    if _URL_TOKEN.search(value):
        return "an http(s) URL with a user name, the place of a token (https://user@host)"
    pair = _CREDENTIAL_PAIR.search(value)
    if pair is not None:
        key = pair.group(0).lstrip(" \t\n;&?,").split("=", 1)[0].strip()
        return f"a credential ({key.lower()}=...)"
    if name == "NODE_OPTIONS":
        for option in value.split():
            flag = option.split("=", 1)[0]
            if flag in NODE_CODE_OPTIONS:
                return f"the option {flag}, which loads code into every node process"
    return None


def check_env_names(env: dict[str, str]) -> None:
    """Refuses a variable (ValueError naming the variable, never the value) whose name is not
    a plain upper-case name, looks like a secret or a proxy, or changes what code a process
    runs (:func:`code_variable`), or whose value holds NUL or a credential
    (:func:`credential_in_value`). Every ``env`` a task, a check or the host configuration
    gives (a check's, an environment's) passes here."""
    for name, value in env.items():
        if not ENV_NAME.match(name):
            msg = f"environment name {name[:64]!r} is not allowed"
            raise ValueError(msg)
        if code_variable(name):
            msg = (
                f"environment variable {name} makes programs load or run other code and is "
                f"refused; a command that needs it sets it in its own argv (env {name}=VALUE ...)"
            )
            raise ValueError(msg)
        if SECRET_NAME.search(name) or _PROXY_NAME.search(name):
            msg = f"environment variable {name} looks like a secret or a proxy and is refused"
            raise ValueError(msg)
        if "\x00" in value:
            msg = f"environment variable {name} contains NUL"
            raise ValueError(msg)
        found = credential_in_value(name, value)
        if found is not None:
            msg = f"environment variable {name} holds {found} and is refused"
            raise ValueError(msg)
