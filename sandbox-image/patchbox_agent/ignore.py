"""What git ignores in the workspace, asked so that nothing a check can write decides it.

Checks run repository code as the agent's own uid, so nothing the ignore filter relies on
may live where that uid can write:

- git runs through an empty bare git dir made at image build time, root-owned and
  read-only (:data:`BAKED_GIT_DIR`); where it is missing or writable (the agent as a host
  process) a private one is made when the file index is created, before any process runs
  (:func:`ignore_git_dir`);
- git's environment is built from nothing (no inherited ``GIT_DIR``, ``GIT_WORK_TREE``,
  ``GIT_CONFIG_*``), with no system or global config, ``HOME`` and ``XDG_CONFIG_HOME``
  pointing at that git dir, and no excludes file;
- git never reads a ``.gitignore`` from the workspace: the file index
  (:mod:`patchbox_agent.index`) reads them itself, and :func:`patterns` rewrites their rules
  relative to the top for git, which gets them through a memory file (:func:`ignored`).

Where git is missing nothing is ignored.
"""

from __future__ import annotations

import os

from . import procs

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Optional, Tuple

BAKED_GIT_DIR = "/opt/patchbox/ignore-git"
"""The empty bare git dir of the image (made by the Dockerfile, root-owned, read-only)."""

_GIT_OPTS = [
    "-c",
    "core.fsmonitor=false",
    "-c",
    "core.untrackedCache=false",
    "-c",
    "core.hooksPath=/dev/null",
    "-c",
    "core.excludesFile=/dev/null",
    "-c",
    "core.attributesFile=/dev/null",
    "-c",
    "core.ignoreCase=false",
    "-c",
    "core.precomposeUnicode=false",
]
_WILD = frozenset(b"*?[\\")


def _git_env(home: str) -> Dict[str, str]:
    """git's whole environment: nothing inherited, no config outside the private git dir."""
    return {
        "HOME": home,
        "XDG_CONFIG_HOME": home,
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_ATTR_NOSYSTEM": "1",
        "GIT_OPTIONAL_LOCKS": "0",
        "GIT_LITERAL_PATHSPECS": "1",
        "GIT_TERMINAL_PROMPT": "0",
        "LC_ALL": "C",
    }


def _baked_git_dir() -> Optional[str]:
    """:data:`BAKED_GIT_DIR` if it exists and this process cannot write it (or its parent)."""
    try:
        st = os.stat(BAKED_GIT_DIR, follow_symlinks=False)
    except OSError:
        return None
    import stat  # imported on first use: a faster start

    if not stat.S_ISDIR(st.st_mode) or st.st_uid == os.getuid():
        return None
    parent = os.path.dirname(BAKED_GIT_DIR)
    if os.access(BAKED_GIT_DIR, os.W_OK) or os.access(parent, os.W_OK):
        return None
    return BAKED_GIT_DIR


def _private_git_dir() -> Optional[str]:
    """A fresh empty bare git dir under ``$TMPDIR`` (the agent as a host process, which has
    no isolation anyway), or None where git cannot make one."""
    import subprocess  # imported on first use: a faster start

    home = os.path.join(
        os.environ.get("TMPDIR") or "/tmp", ".patchbox-index-" + os.urandom(8).hex()
    )
    try:
        os.mkdir(home, 0o700)
        path = os.path.join(home, "git")
        procs.run(
            ["git", *_GIT_OPTS, "init", "-q", "--bare", "--template=", path],
            env=_git_env(home),
            stdin=subprocess.DEVNULL,
            cwd="/",
            check=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return path


def ignore_git_dir() -> Optional[str]:
    """The git dir to ask: :data:`BAKED_GIT_DIR` if this process cannot write it, else a
    private one made now; None where git cannot make one."""
    return _baked_git_dir() or _private_git_dir()


def _trim_trailing_spaces(line: bytes) -> bytes:
    """git's rule: trailing spaces go unless escaped with a backslash."""
    last_space = -1
    i = 0
    while i < len(line):
        c = line[i]
        if c == 0x20:
            if last_space < 0:
                last_space = i
        elif c == 0x5C:
            i += 1
            if i >= len(line):
                return line
            last_space = -1
        else:
            last_space = -1
        i += 1
    return line[:last_space] if last_space >= 0 else line


def translate(directory: str, content: bytes) -> List[bytes]:
    """The patterns of ``directory``'s ``.gitignore`` as patterns relative to the top.

    git reads the file the same way (BOM, CR before LF, comments, blank lines, trailing
    spaces, ``!``): a pattern with a slash before its end is anchored at the file's folder,
    one without matches at any depth below it (``/DIR/**/PATTERN``). Given deeper files'
    patterns after shallower ones, git's last match in one list then decides as its
    per-folder precedence does."""
    if content.startswith(b"\xef\xbb\xbf"):
        content = content[3:]
    raw = os.fsencode(directory)
    prefix = b"/" + bytes(b for c in raw for b in ((0x5C, c) if c in _WILD else (c,)))
    out: List[bytes] = []
    for raw_line in content.split(b"\n"):
        line = raw_line.split(b"\0", 1)[0]
        line = line.removesuffix(b"\r")
        if not line or line.startswith(b"#"):
            continue
        line = _trim_trailing_spaces(line)
        if not directory:
            if line:
                out.append(line)
            continue
        neg = line.startswith(b"!")
        body = line[1:] if neg else line
        must_dir = body.endswith(b"/")
        if must_dir:
            body = body[:-1]
        if not body:
            continue
        if b"/" in body:
            body = body[1:] if body.startswith(b"/") else body
            pattern = prefix + b"/" + body
        else:
            pattern = prefix + b"/**/" + body
        out.append((b"!" if neg else b"") + pattern + (b"/" if must_dir else b""))
    return out


def patterns(rules: Dict[str, bytes]) -> bytes:
    """One exclude file for ``rules`` (folder -> its ``.gitignore`` bytes), shallow first."""
    lines: List[bytes] = []
    for directory in sorted(rules, key=lambda d: (d.count("/") + bool(d), d)):
        lines += translate(directory, rules[directory])
    return b"".join(line + b"\n" for line in lines)


def ignored(
    git_dir: Optional[str], workspace: str, excludes: bytes, paths: Optional[List[str]] = None
) -> Tuple[set[str], bool]:
    """What ``excludes`` (one exclude file, :func:`patterns`) ignore in ``workspace``: in the
    whole tree, or among ``paths``; and whether git answered (False without a git dir or
    when git failed, and then nothing is ignored)."""
    import subprocess  # imported on first use: a faster start

    if not excludes:
        return set(), git_dir is not None
    if git_dir is None:
        return set(), False
    found: set[str] = set()
    try:
        fd = os.memfd_create("patchbox-excludes", getattr(os, "MFD_CLOEXEC", 1))
    except (AttributeError, OSError):
        return set(), False
    try:
        view = memoryview(excludes)
        while view:
            view = view[os.write(fd, view) :]
        for chunk in _chunks(paths) if paths is not None else [None]:
            argv = [
                "git",
                *_GIT_OPTS,
                f"--git-dir={git_dir}",
                f"--work-tree={workspace}",
                "ls-files",
                "-z",
                "--others",
                "--ignored",
                f"--exclude-from=/proc/self/fd/{fd}",
            ]
            if chunk is not None:
                argv += ["--", *chunk]
            out = procs.run(
                argv,
                env=_git_env(git_dir),
                cwd="/",
                stdin=subprocess.DEVNULL,
                pass_fds=(fd,),
                check=True,
                timeout=120,
            ).stdout
            found.update(p for p in out.decode("utf-8", "surrogateescape").split("\0") if p)
    except (OSError, subprocess.SubprocessError):
        return set(), False
    finally:
        os.close(fd)
    return found, True


def _chunks(paths: List[str]) -> List[List[str]]:
    """``paths`` in argument lists of at most about 64 KiB."""
    out: List[List[str]] = []
    size = 0
    for p in paths:
        if not out or size + len(p) > 64 * 1024:
            out.append([])
            size = 0
        out[-1].append(p)
        size += len(p) + 1
    return out
