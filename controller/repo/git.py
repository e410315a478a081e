"""Every git command the controller runs goes through :func:`run_git`.

The environment is rebuilt from nothing: no system or global configuration, no pager, no
prompt, no credential helper, no lazy fetch, no optional locks (so a read such as
``status`` never refreshes anybody's index). The command line turns off hooks, fsmonitor,
external diff and textconv, and every transport. Commands run with the controller's own
folder as working directory, never in a tree the sandbox wrote.

Commands that look at a user's work tree do so through a *private* git dir (see
:mod:`controller.repo.baseline`): git then never reads the repository's own configuration, so
``core.fsmonitor``, ``core.hooksPath``, filter, diff and merge drivers of a hostile
``.git/config`` are simply unknown to it.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from controller.errormap import map_git_error
from controller.errors import GitError

GIT_TIMEOUT = 600.0

HARDENED_CONFIG: tuple[tuple[str, str], ...] = (
    ("core.hooksPath", "/dev/null"),
    ("core.fsmonitor", "false"),
    ("core.untrackedCache", "false"),
    ("core.pager", "cat"),
    ("core.askPass", ""),
    ("core.sshCommand", "false"),
    ("core.autocrlf", "false"),
    ("core.safecrlf", "false"),
    ("core.symlinks", "true"),
    ("core.quotePath", "false"),
    ("credential.helper", ""),
    ("protocol.allow", "never"),
    ("diff.external", ""),
    ("diff.noprefix", "false"),
    ("log.showSignature", "false"),
    ("gc.auto", "0"),
    ("maintenance.auto", "false"),
    ("advice.detachedHead", "false"),
    ("init.defaultBranch", "main"),
    ("user.name", "patchbox"),
    ("user.email", "patchbox@localhost"),
)
"""``-c`` settings on every command; the command line beats every configuration file."""

FIXED_DATE = "1700000000 +0000"
"""Author and committer date of the controller's private commits: same tree, same id."""


def git_env(home: Path) -> dict[str, str]:
    """The whole environment of a git command: nothing inherited but ``PATH``."""
    return {
        "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home),
        "LC_ALL": "C",
        "LANG": "C",
        "TZ": "UTC",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_CONFIG_SYSTEM": os.devnull,
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_ASKPASS": "",
        "SSH_ASKPASS": "",
        "GIT_PAGER": "cat",
        "PAGER": "cat",
        "GIT_EDITOR": "false",
        "GIT_OPTIONAL_LOCKS": "0",
        "GIT_NO_REPLACE_OBJECTS": "1",
        "GIT_NO_LAZY_FETCH": "1",
        "GIT_PROTOCOL_FROM_USER": "0",
        "GIT_ALLOW_PROTOCOL": "",
        "GIT_ATTR_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "patchbox",
        "GIT_AUTHOR_EMAIL": "patchbox@localhost",
        "GIT_AUTHOR_DATE": FIXED_DATE,
        "GIT_COMMITTER_NAME": "patchbox",
        "GIT_COMMITTER_EMAIL": "patchbox@localhost",
        "GIT_COMMITTER_DATE": FIXED_DATE,
    }


@dataclass(frozen=True)
class GitContext:
    """Where a command runs: ``cwd`` is a controller-owned folder; the rest are optional."""

    cwd: Path
    git_dir: Path | None = None
    work_tree: Path | None = None
    index_file: Path | None = None
    home: Path | None = None
    object_dir: Path | None = None
    """Where new objects go; with it, the git dir's alternates are not read."""
    literal_pathspecs: bool = False
    """Paths on the command line are names, never patterns or ``:(magic)``."""

    def env(self) -> dict[str, str]:
        env = git_env(self.home or self.cwd)
        if self.git_dir is not None:
            env["GIT_DIR"] = str(self.git_dir)
        if self.work_tree is not None:
            env["GIT_WORK_TREE"] = str(self.work_tree)
        if self.index_file is not None:
            env["GIT_INDEX_FILE"] = str(self.index_file)
        if self.object_dir is not None:
            env["GIT_OBJECT_DIRECTORY"] = str(self.object_dir)
        if self.literal_pathspecs:
            env["GIT_LITERAL_PATHSPECS"] = "1"
        return env


def git_argv(*args: str) -> list[str]:
    argv = ["git", "--no-pager", "--no-replace-objects"]
    for key, value in HARDENED_CONFIG:
        argv += ["-c", f"{key}={value}"]
    return [*argv, *args]


def run_git(
    ctx: GitContext,
    *args: str,
    stdin: bytes | None = None,
    check: bool = True,
    timeout: float = GIT_TIMEOUT,
    spool: bool = False,
) -> subprocess.CompletedProcess[bytes]:
    """Runs one hardened git command and returns its bytes; ``GitError`` when it fails and
    ``check`` is set. Raises ``GitError`` too when git is missing or too slow.

    With ``spool``, its input and output go through anonymous temp files instead of pipes:
    the calling thread then only waits for the process, so git never stalls on a full pipe
    while another thread holds the interpreter."""
    source: IO[bytes] | None = None
    sink: IO[bytes] | None = None
    errors: IO[bytes] | None = None
    with contextlib.ExitStack() as files:
        if spool:
            source, sink, errors = (files.enter_context(tempfile.TemporaryFile()) for _ in range(3))
            source.write(stdin or b"")
            source.seek(0)
        try:
            proc = subprocess.run(
                git_argv(*args),
                cwd=ctx.cwd,
                env=ctx.env(),
                input=None if spool else stdin,
                stdin=source,
                stdout=sink or subprocess.PIPE,
                stderr=errors or subprocess.PIPE,
                timeout=timeout,
                check=False,
            )
        except (FileNotFoundError, subprocess.TimeoutExpired) as exc:
            raise map_git_error(exc, args[0]) from exc
        if sink is not None and errors is not None:
            proc.stdout, proc.stderr = _read_back(sink), _read_back(errors)
    if check and proc.returncode != 0:
        detail = proc.stderr.decode("utf-8", "replace").strip().splitlines()
        raise GitError(f"git {args[0]} failed: {(detail[-1] if detail else '')[:300]}")
    return proc


def _read_back(file: IO[bytes]) -> bytes:
    file.seek(0)
    return file.read()


def git_version() -> str:
    """``git version X`` of the host's git, or raises ``GitError``."""
    home = Path(os.devnull).parent
    return run_git(GitContext(cwd=home, home=home), "version").stdout.decode().strip()
