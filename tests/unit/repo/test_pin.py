"""A service job's repository held to the folder it was resolved to
(:mod:`controller.repo.pin`), attacked on real folders and real git repositories: links
below a root, folders swapped after the pin, git data (``.git`` file, ``commondir``,
alternates, links in the git dir, configured files) pointing into another tenant's root,
and writes through a pinned work tree after a swap."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from controller.changes.worktree import WorkTree
from controller.errors import ErrorCode, PatchboxError
from controller.repo.pin import Confinement, RepoPin, pin_repo
from tests.support.git import Repo, init
from tests.support.jobs import snapshot


def refused(call: Callable[..., object], *args: object, **kwargs: object) -> PatchboxError:
    with pytest.raises(PatchboxError) as caught:
        call(*args, **kwargs)
    return caught.value


@pytest.fixture
def roots(tmp_path: Path) -> tuple[Confinement, Repo, Repo]:
    """Tenant alpha's confinement (its root reached through an operator's link, the
    service's data folder inside it excluded), alpha's repository and beta's."""
    (tmp_path / "alpha").mkdir()
    (tmp_path / "operator-link").symlink_to(tmp_path / "alpha", target_is_directory=True)
    confinement = Confinement.of(
        "alpha", [str(tmp_path / "operator-link")], [str(tmp_path / "alpha" / "data")]
    )
    alpha = init(tmp_path / "alpha" / "repo", {"a.txt": "alpha\n"})
    beta = init(tmp_path / "beta" / "repo", {"secret.txt": "beta's secret\n"})
    return confinement, alpha, beta


def swap(folder: Path, target: Path) -> Path:
    """Moves ``folder`` aside and puts a link to ``target`` in its place; the moved path."""
    aside = folder.with_name(folder.name + ".orig")
    folder.rename(aside)
    folder.symlink_to(target, target_is_directory=True)
    return aside


def restore(folder: Path, aside: Path) -> None:
    folder.unlink()
    aside.rename(folder)


def test_a_repository_is_pinned_by_its_real_path_below_a_root(
    roots: tuple[Confinement, Repo, Repo], tmp_path: Path
) -> None:
    confinement, alpha, _beta = roots
    by_real = pin_repo(confinement, str(alpha.path))
    by_operator = pin_repo(confinement, str(tmp_path / "operator-link" / "repo") + "/")
    assert by_real == by_operator
    assert by_real.path == str(alpha.path)
    info = alpha.path.stat()
    assert (by_real.dev, by_real.ino) == (info.st_dev, info.st_ino)
    by_real.verify()
    record = by_real.record()
    assert RepoPin.of_record(by_real.path, record, confinement) == by_real


def test_paths_outside_through_links_or_dot_dot_are_refused(
    roots: tuple[Confinement, Repo, Repo], tmp_path: Path
) -> None:
    confinement, alpha, beta = roots
    alpha_root = tmp_path / "alpha"
    (alpha_root / "to-beta").symlink_to(beta.path, target_is_directory=True)
    (alpha_root / "to-own").symlink_to(alpha.path, target_is_directory=True)
    (alpha_root / "beta-root").symlink_to(beta.path.parent, target_is_directory=True)
    (alpha_root / "data" / "clone").mkdir(parents=True)
    cases = {
        str(beta.path): "outside the repo_roots of tenant 'alpha'",
        str(alpha_root / "to-beta"): "goes through a symbolic link below its repository root",
        str(alpha_root / "to-own"): "goes through a symbolic link below its repository root",
        str(alpha_root / "beta-root" / "repo"): "(beta-root)",
        str(alpha_root / "repo" / ".." / "repo"): "has a '..' component",
        str(alpha_root / "data" / "clone"): "the service's own folder",
    }
    for path, words in cases.items():
        error = refused(pin_repo, confinement, path)
        assert error.code is ErrorCode.REPO_NOT_ALLOWED, path
        assert words in error.message, (path, error.message)
        assert "secret" not in error.message
    missing = refused(pin_repo, confinement, str(alpha_root / "gone"))
    assert (missing.code, missing.message) == (
        ErrorCode.NOT_A_REPOSITORY,
        f"{alpha_root / 'gone'} does not exist",
    )
    (alpha_root / "file").write_text("x")
    assert refused(pin_repo, confinement, str(alpha_root / "file")).code is (
        ErrorCode.NOT_A_REPOSITORY
    )


def test_a_folder_swapped_after_the_pin_is_refused_until_it_is_back(
    roots: tuple[Confinement, Repo, Repo],
) -> None:
    confinement, alpha, beta = roots
    pin = pin_repo(confinement, str(alpha.path))
    aside = swap(alpha.path, beta.path)
    for check in (pin.open, pin.verify, pin.check_roots):
        error = refused(check)
        assert error.code is ErrorCode.REPO_NOT_ALLOWED
        assert "symbolic link below its repository root (repo)" in error.message
    restore(alpha.path, aside)
    os.close(pin.open())
    # the same path, another folder (moved aside, a new one made): not the one pinned
    aside = alpha.path.with_name("repo.moved")
    alpha.path.rename(aside)
    alpha.path.mkdir()
    error = refused(pin.verify)
    assert error.code is ErrorCode.REPO_NOT_ALLOWED
    assert "no longer the folder the job was submitted on" in error.message
    pin.check_roots()  # a discard only needs the path to stay inside the roots
    alpha.path.rmdir()
    pin.check_roots()  # or to lead nowhere
    assert refused(pin.verify).code is ErrorCode.NOT_A_REPOSITORY
    aside.rename(alpha.path)
    pin.verify()
    error = refused(pin.confirm, str(beta.path))
    assert error.code is ErrorCode.REPO_NOT_ALLOWED
    assert "was replaced while the job read it" in error.message


def fifo_git_dir(folder: Path) -> Path:
    """A git dir whose HEAD and index are FIFOs: reading either would block for good."""
    (folder / "objects" / "info").mkdir(parents=True)
    (folder / "refs").mkdir()
    os.mkfifo(folder / "HEAD")
    os.mkfifo(folder / "index")
    return folder


def check_refused_in_time(pin: RepoPin, words: str, beta: Repo) -> None:
    """``pin.verify()`` refuses with ``words`` in its message, without blocking on a FIFO
    (nothing of the other git dir is read) and without beta's HEAD id."""
    outcome: list[BaseException] = []

    def verify() -> None:
        try:
            pin.verify()
        except BaseException as exc:  # handed to the test's thread
            outcome.append(exc)

    thread = threading.Thread(target=verify, daemon=True)
    thread.start()
    thread.join(timeout=20)
    assert not thread.is_alive(), "the check read the other git dir (a FIFO blocked it)"
    (error,) = outcome
    assert isinstance(error, PatchboxError), error
    assert error.code is ErrorCode.REPO_NOT_ALLOWED
    assert words in error.message, error.message
    assert "keeps git data outside the repo_roots of tenant 'alpha'" in error.message
    assert beta.head() not in error.message


def test_git_data_in_another_tenants_root_is_refused_before_it_is_read(
    roots: tuple[Confinement, Repo, Repo], tmp_path: Path
) -> None:
    confinement, _alpha, beta = roots
    trap = fifo_git_dir(tmp_path / "beta" / "trap")
    # a .git file naming the other tenant's git dir
    work = tmp_path / "alpha" / "gitfile"
    work.mkdir()
    (work / ".git").write_text(f"gitdir: {trap}\n")
    check_refused_in_time(pin_repo(confinement, str(work)), "the git dir its .git file names", beta)
    (work / ".git").write_text("gitdir: ../../beta/repo/.git\n")  # relative, the same
    check_refused_in_time(pin_repo(confinement, str(work)), "the git dir its .git file names", beta)
    # a linked worktree's commondir naming it
    own = tmp_path / "alpha" / "linked-git"
    own.mkdir()
    (own / "HEAD").write_text("ref: refs/heads/main\n")
    (own / "commondir").write_text(f"{trap}\n")
    (work / ".git").write_text(f"gitdir: {own}\n")
    check_refused_in_time(
        pin_repo(confinement, str(work)), "the common git dir its commondir names", beta
    )
    # a .git file into the service's own folder (another tenant's bundle clone)
    clone = tmp_path / "alpha" / "data" / "beta" / "clones" / "job" / ".git"
    clone.mkdir(parents=True)
    (work / ".git").write_text(f"gitdir: {clone}\n")
    check_refused_in_time(pin_repo(confinement, str(work)), "the git dir its .git file names", beta)


def test_alternates_and_links_in_the_git_dir_must_stay_inside_the_roots(
    roots: tuple[Confinement, Repo, Repo], tmp_path: Path
) -> None:
    confinement, alpha, beta = roots
    pin = pin_repo(confinement, str(alpha.path))
    git_dir = alpha.path / ".git"
    alternates = git_dir / "objects" / "info" / "alternates"
    alternates.write_text(f"{beta.path / '.git' / 'objects'}\n")
    check_refused_in_time(pin, "(objects/info/alternates)", beta)
    # a chain: alpha borrows from alpha's other repository, which borrows from beta
    other = init(tmp_path / "alpha" / "other", {"o.txt": "o\n"})
    alternates.write_text(f"# shared\n\n{other.path / '.git' / 'objects'}\n")
    pin.verify()
    (other.path / ".git" / "objects" / "info" / "alternates").write_text(
        "../../../../beta/repo/.git/objects\n"
    )
    check_refused_in_time(pin, "(objects/info/alternates)", beta)
    alternates.unlink()
    pin.verify()
    # links anywhere in the git dir: a ref, the packs, the index
    for rel, target in (
        ("refs/heads/evil", beta.path / ".git" / "refs" / "heads" / "main"),
        ("objects/pack-beta", beta.path / ".git" / "objects"),
        ("index.link", beta.path / ".git" / "index"),
    ):
        link = git_dir / rel
        link.symlink_to(target)
        check_refused_in_time(pin, f"a symbolic link in the git dir: {rel}", beta)
        link.unlink()
    (git_dir / "refs" / "heads" / "own").symlink_to(git_dir / "refs" / "heads" / "main")
    pin.verify()  # a link that stays inside the roots is the tenant's business
    # files the repository's own configuration names
    for key in ("core.excludesFile", "core.attributesFile"):
        alpha.git("config", key, str(beta.path / "secret.txt"))
        check_refused_in_time(pin, f"(its {key})", beta)
        alpha.git("config", key, "own-ignore")
        pin.verify()
        alpha.git("config", "--unset", key)


def test_files_the_git_config_includes_must_stay_inside_the_roots(
    roots: tuple[Confinement, Repo, Repo], tmp_path: Path
) -> None:
    """git follows ``include.path`` and ``includeIf.*.path`` of the repository's config: a
    file of the other tenant's (or one that names a file of theirs) is refused, however the
    include is written and however deep; what stays inside the roots is the tenant's."""
    confinement, alpha, beta = roots
    pin = pin_repo(confinement, str(alpha.path))
    theirs = beta.path / "x.cfg"
    theirs.write_text(f"[core]\n\texcludesFile = {beta.path / 'secret.txt'}\n")
    relative = os.path.relpath(theirs, alpha.path / ".git")
    for key, value in (
        ("include.path", str(theirs)),
        ("include.path", relative),
        ("includeIf.gitdir:/.path", str(theirs)),
        ("includeIf.onbranch:main.path", relative),
        ("include.path", str(tmp_path / "beta" / "missing.cfg")),  # git skips it; refused
    ):
        alpha.git("config", key, value)
        check_refused_in_time(pin, "a file its git config includes", beta)
        alpha.git("config", "--unset", key)
        pin.verify()
    # an include of its own that sets a file of theirs, or includes theirs in turn
    own = alpha.path / ".git" / "own.cfg"
    own.write_text(f"[core]\n\tattributesFile = {beta.path / 'secret.txt'}\n")
    alpha.git("config", "include.path", "own.cfg")
    check_refused_in_time(pin, "(its core.attributesFile)", beta)
    own.write_text(f"[include]\n\tpath = {theirs}\n")
    check_refused_in_time(pin, "a file its git config includes", beta)
    own.write_text("[core]\n\tattributesFile = own-attributes\n")
    pin.verify()
    # a loop of its own is not followed forever
    own.write_text("[include]\n\tpath = own.cfg\n")
    pin.verify()
    (alpha.path / ".git" / "fifo.cfg").unlink(missing_ok=True)
    os.mkfifo(alpha.path / ".git" / "fifo.cfg")
    own.write_text("[include]\n\tpath = fifo.cfg\n")
    pin.verify()  # a FIFO of its own is not read


def test_a_pinned_work_tree_writes_only_the_folder_pinned(
    roots: tuple[Confinement, Repo, Repo],
) -> None:
    confinement, alpha, beta = roots
    pin = pin_repo(confinement, str(alpha.path))
    before = snapshot(beta.path)
    aside = swap(alpha.path, beta.path)
    error = refused(WorkTree, alpha.path, pin=pin)
    assert error.code is ErrorCode.REPO_NOT_ALLOWED
    with WorkTree(alpha.path) as followed:  # unpinned (the CLI's): the link is followed
        assert followed.state("secret.txt").kind == "file"
    restore(alpha.path, aside)
    with WorkTree(alpha.path, pin=pin) as wt:
        aside = swap(alpha.path, beta.path)  # after the open: the writes stay in alpha's
        wt.write_temps([("new.txt", ".new.tmp", b"alpha's write\n", 0o644)])
        wt.replace("new.txt", ".new.tmp")
        assert wt.state("a.txt").kind == "file"
        assert wt.state("secret.txt").kind == "missing"
    assert snapshot(beta.path) == before
    assert (aside / "new.txt").read_text() == "alpha's write\n"
    restore(alpha.path, aside)
    refused_top = refused(WorkTree, beta.path, pin=pin)
    assert refused_top.code is ErrorCode.REPO_NOT_ALLOWED
    assert "is not the repository" in refused_top.message
