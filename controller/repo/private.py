"""The controller's own git dir for one user repository: it borrows the user's objects
read-only, keeps its own config, attributes and excludes, and writes objects only into a
folder of its own (see :mod:`controller.repo.baseline` for why each of these holds)."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

from controller.paths import patchbox_home
from controller.repo.git import FIXED_DATE, GitContext, run_git
from controller.repo.layout import (
    RepoLayout,
    environment_attributes,
    environment_excludes,
    read_config,
)

NEUTRAL_ATTRIBUTES = (
    "* -text -eol -crlf -filter -ident -working-tree-encoding -export-ignore -export-subst\n"
)
"""The private git dir's ``info/attributes``: the highest-precedence attributes file, so no
``.gitattributes`` of the repository can convert, filter or drop content."""

_CONVERTING = re.compile(rb"(^|\s)(-?text|eol=|crlf|filter=|ident|working-tree-encoding)")
DATA_LIMIT = 1 << 20
COMMIT_MESSAGE = "patchbox baseline"


def _repo_key(layout: RepoLayout) -> str:
    return hashlib.sha256(str(layout.common_dir).encode()).hexdigest()[:24]


class PrivateRepo:
    """The controller's own git dir for one user repository (created on first use)."""

    def __init__(self, layout: RepoLayout, home: Path | None = None) -> None:
        self.layout = layout
        self.root = (home or patchbox_home()) / "repos" / _repo_key(layout)
        self.git_dir = self.root / "git"
        self.view_dir = self.root / "view"
        self.own_objects = self.root / "objects"
        """Where builds write objects, with no alternates: git then never "freshens" (sets
        the mtime of) an object file or pack of the user's repository that holds the same
        object. The private git dir reads it as its second alternate."""

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Serialises builds for one repository (they share the private HEAD)."""
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        with (self.root / "lock").open("a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def ctx(
        self,
        *,
        index: Path | None = None,
        work_tree: bool = False,
        view: bool = False,
        writes: bool = False,
    ) -> GitContext:
        """``writes``: the command writes objects, into :attr:`own_objects` only (it cannot
        read the user's objects then)."""
        return GitContext(
            cwd=self.root,
            git_dir=self.view_dir if view else self.git_dir,
            work_tree=self.layout.top if work_tree else None,
            index_file=index,
            home=self.root,
            object_dir=self.own_objects if writes else None,
        )

    def ensure(self) -> None:
        self._init(self.git_dir, NEUTRAL_ATTRIBUTES.encode())

    def ensure_view(self) -> None:
        """A second private git dir that keeps the repository's own attributes (read as
        data), so that its ``status`` sees line endings as the user's ``git status`` does.
        It has no filter or diff drivers, hooks or fsmonitor: nothing there can run."""
        self._init(self.view_dir, read_data(self.layout.common_dir / "info" / "attributes"))

    def _init(self, git_dir: Path, attributes: bytes) -> None:
        if not (git_dir / "HEAD").is_file():
            tmp = self.root / f"{git_dir.name}.tmp{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            fmt = read_config(self.layout, "extensions.objectformat") or "sha1"
            run_git(
                GitContext(cwd=self.root, home=self.root),
                "init",
                "-q",
                "--bare",
                f"--object-format={fmt}",
                str(tmp),
            )
            shutil.rmtree(tmp / "hooks", ignore_errors=True)
            tmp.replace(git_dir)
        self.own_objects.mkdir(exist_ok=True)
        alternates = f"{self.layout.common_dir / 'objects'}\n{self.own_objects}\n"
        _replace(git_dir / "objects" / "info" / "alternates", alternates.encode())
        info = git_dir / "info"
        info.mkdir(exist_ok=True)
        _replace(info / "attributes", attributes)
        # The user's excludes file ranks below info/exclude: in one file, later lines win.
        excludes = [read_data(p, follow=True) for p in environment_excludes(self.layout)]
        excludes.append(read_data(self.layout.common_dir / "info" / "exclude"))
        _replace(info / "exclude", b"\n".join(excludes) + b"\n")

    def set_head(self, oid: str, *, view: bool = False) -> None:
        ((self.view_dir if view else self.git_dir) / "HEAD").write_text(f"{oid}\n")

    def git(
        self,
        *args: str,
        index: Path | None = None,
        work_tree: bool = False,
        view: bool = False,
        writes: bool = False,
        stdin: bytes | None = None,
    ) -> bytes:
        ctx = self.ctx(index=index, work_tree=work_tree, view=view, writes=writes)
        return run_git(ctx, *args, stdin=stdin).stdout

    def write_commit(self, tree: str, parent: str) -> str:
        """The commit ``git commit-tree`` makes with the controller's fixed identity and
        date, written without reading any object (``commit-tree`` would read the parent)."""
        who = f"patchbox <patchbox@localhost> {FIXED_DATE}"
        body = f"tree {tree}\nparent {parent}\nauthor {who}\ncommitter {who}\n\n{COMMIT_MESSAGE}\n"
        args = ("hash-object", "-t", "commit", "-w", "--stdin")
        return self.git(*args, writes=True, stdin=body.encode()).decode().strip()


def _replace(path: Path, data: bytes) -> None:
    """Writes ``path`` atomically when its content differs: a ``git archive`` running
    meanwhile without the lock never sees a half-written alternates or attributes file."""
    if path.is_file() and read_data(path) == data:
        return
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    tmp.write_bytes(data)
    tmp.replace(path)


def read_data(path: Path, *, follow: bool = False) -> bytes:
    """At most 1 MiB of a regular file, read as data; ``b""`` for anything else (a FIFO
    would block the read). Symlinks are followed only with ``follow``."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError:
        return b""
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return b""
        with os.fdopen(os.dup(fd), "rb") as handle:
            return handle.read(DATA_LIMIT)
    except OSError:
        return b""
    finally:
        os.close(fd)


def converts_content(layout: RepoLayout, attribute_files: list[Path]) -> bool:
    """True when the user's checkout may differ from the blobs (eol or filter settings)."""
    for key in ("core.autocrlf", "core.eol"):
        value = (read_config(layout, key) or "").lower()
        if value and value not in {"false", "lf", "native", "no", "off", "0"}:
            return True
    sources = [layout.common_dir / "info" / "attributes", *attribute_files]
    if any(_CONVERTING.search(read_data(source)) for source in sources):
        return True
    return any(
        _CONVERTING.search(read_data(source, follow=True))
        for source in environment_attributes(layout)
    )
