"""The private baseline: its tar holds exactly the work tree the user sees,
it is deterministic, the user's repository is never written, and a hostile repository
configuration runs nothing on the host. Every case is a real repository in a temp folder."""

from __future__ import annotations

import os
import random
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from controller.errors import ErrorCode, PatchboxError
from controller.repo.baseline import archive_stream, build_baseline, predicted_tree
from controller.repo.health import check_health
from tests.support.baseline import (
    Files,
    archive_files,
    isolate,
    leftovers,
    snapshot,
    work_tree_files,
)
from tests.support.git import Repo, init, refs_and_logs

BASE: dict[str, bytes | str] = {
    ".gitignore": "*.log\nignored/\n",
    "keep.txt": "keep\n",
    "staged.txt": "staged before\n",
    "unstaged.txt": "unstaged before\n",
    "both.txt": "both before\n",
    "gone-staged.txt": "deleted with git rm\n",
    "gone-unstaged.txt": "deleted with rm\n",
    "restored.txt": "as in HEAD\n",
    "to-exec.sh": "#!/bin/sh\n",
    "src/deep/module.py": "x = 1\n",
}


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    yield isolate(tmp_path, monkeypatch)
    assert not leftovers(tmp_path)


def base_repo(path: Path, env: dict[str, str], *args: str) -> Repo:
    repo = init(path, BASE, *args, env=env)
    repo.write("was-exec.sh", "#!/bin/sh\n", executable=True)
    repo.commit("exec")
    return repo


@pytest.fixture
def repo(tmp_path: Path, env: dict[str, str]) -> Repo:
    return base_repo(tmp_path / "repo", env)


def dirty_everything(repo: Repo) -> set[str]:
    """Every kind of local change; returns the ignored paths it made."""
    repo.write("staged.txt", "staged after\n")
    repo.git("add", "staged.txt")
    repo.write("unstaged.txt", "unstaged after\n")
    repo.write("both.txt", "both: staged\n")
    repo.git("add", "both.txt")
    repo.write("both.txt", "both: staged, then unstaged\n")
    repo.git("rm", "-q", "gone-staged.txt")
    (repo.path / "gone-unstaged.txt").unlink()
    repo.write("restored.txt", "staged, then put back\n")
    repo.git("add", "restored.txt")
    repo.write("restored.txt", "as in HEAD\n")
    (repo.path / "to-exec.sh").chmod(0o755)
    (repo.path / "was-exec.sh").chmod(0o644)
    repo.write("src/deep/module.py", "")  # emptied
    repo.write("new-staged.txt", "added\n")
    repo.git("add", "new-staged.txt")
    repo.write("new-empty.txt", "")
    repo.write("crlf.txt", b"one\r\ntwo\r\n")
    repo.write("lone-cr.bin", b"\x00\xff\r\x80")
    repo.write("ünïcödé/файл ü.txt", "non-ASCII\n")
    repo.write("日本語.txt", "名前\n")
    repo.write("tool.sh", "#!/bin/sh\necho new\n", executable=True)
    (repo.path / "empty-folder").mkdir()
    ignored = {"build.log", "ignored/out.txt", "src/deep/trace.log", "excluded.txt", "global.tmp"}
    for name in ignored:
        repo.write(name, "ignored\n")
    (repo.path / repo.git("rev-parse", "--git-path", "info/exclude")).write_text("excluded.txt\n")
    global_ignore = Path(os.environ["XDG_CONFIG_HOME"]) / "git" / "ignore"
    global_ignore.parent.mkdir(parents=True, exist_ok=True)
    global_ignore.write_text("*.tmp\n")
    return ignored


def test_predicted_tree_is_heads_and_only_a_guess(repo: Repo, tmp_path: Path) -> None:
    """Before any baseline there is no private git dir to ask (None); after one, HEAD's
    tree, read without writing the repository, whatever the work tree holds."""
    assert predicted_tree(tmp_path) is None
    assert predicted_tree(repo.path) is None
    baseline, _ = build_baseline(repo.path)
    head_tree = repo.git("rev-parse", "HEAD^{tree}").strip()
    assert predicted_tree(repo.path) == head_tree == baseline.tree
    dirty_everything(repo)
    before = snapshot(repo.path)
    assert predicted_tree(repo.path) == head_tree
    assert snapshot(repo.path) == before  # nothing written, not even an mtime
    dirty, _ = build_baseline(repo.path, "include-local-changes")
    assert dirty.tree != head_tree
    repo.git("add", "-A")
    repo.commit("next")
    assert predicted_tree(repo.path) == repo.git("rev-parse", "HEAD^{tree}").strip()


def test_archive_is_the_work_tree_the_user_sees(repo: Repo) -> None:
    ignored = dirty_everything(repo)
    for name in ignored:
        assert repo.git("check-ignore", name) == name
    baseline, report = build_baseline(repo.path, "include-local-changes")
    files, _ = archive_files(baseline)
    assert files == work_tree_files(repo.path, skip=ignored)
    assert files["staged.txt"] == (b"staged after\n", False)
    assert files["unstaged.txt"] == (b"unstaged after\n", False)
    assert files["both.txt"] == (b"both: staged, then unstaged\n", False)
    assert files["restored.txt"] == (b"as in HEAD\n", False)
    assert files["to-exec.sh"] == (b"#!/bin/sh\n", True)
    assert files["was-exec.sh"] == (b"#!/bin/sh\n", False)
    assert files["tool.sh"][1]
    assert files["src/deep/module.py"] == (b"", False)
    assert files["new-empty.txt"] == (b"", False)
    assert files["crlf.txt"] == (b"one\r\ntwo\r\n", False)
    assert files["lone-cr.bin"] == (b"\x00\xff\r\x80", False)
    assert files["ünïcödé/файл ü.txt"] == (b"non-ASCII\n", False)
    assert files["日本語.txt"] == ("名前\n".encode(), False)
    assert "gone-staged.txt" not in files
    assert "gone-unstaged.txt" not in files
    assert not ignored & set(files)

    assert report.ok
    assert report.counts.untracked_files == 6
    assert baseline.head == repo.head()
    assert baseline.tree != repo.git("rev-parse", "HEAD^{tree}")
    assert baseline.commit not in {baseline.head, baseline.tree}
    assert repo.git("cat-file", "-t", baseline.commit, check=False) == ""  # never in the repo


def test_export_attributes_do_not_change_the_archive(repo: Repo) -> None:
    repo.write(".gitattributes", "dropped.txt export-ignore\nsubst.txt export-subst\n")
    repo.write("dropped.txt", "still here\n")
    repo.write("subst.txt", "$Format:%H$\n")
    repo.commit("export attributes")
    repo.write("keep.txt", "changed\n")
    for mode in ("require-clean", "include-local-changes"):
        repo.write("keep.txt", "keep\n" if mode == "require-clean" else "changed\n")
        baseline, _ = build_baseline(repo.path, mode)
        files, _ = archive_files(baseline)
        assert files == work_tree_files(repo.path)
        assert files["subst.txt"] == (b"$Format:%H$\n", False)
        assert files["dropped.txt"] == (b"still here\n", False)


def test_clean_baseline_is_head(repo: Repo) -> None:
    for mode in ("require-clean", "include-local-changes"):
        baseline, report = build_baseline(repo.path, mode)
        assert not report.dirty
        assert baseline.commit == repo.head()
        assert baseline.tree == repo.git("rev-parse", "HEAD^{tree}")
        assert archive_files(baseline)[0] == work_tree_files(repo.path)


def test_baseline_is_deterministic(
    tmp_path: Path, repo: Repo, monkeypatch: pytest.MonkeyPatch
) -> None:
    dirty_everything(repo)
    first, _ = build_baseline(repo.path, "include-local-changes")
    again, _ = build_baseline(repo.path, "include-local-changes")
    monkeypatch.setenv("PATCHBOX_HOME", str(tmp_path / "another-home"))
    fresh, _ = build_baseline(repo.path, "include-local-changes")
    assert not list((tmp_path / "another-home" / "tmp").iterdir())
    assert fresh.private_git_dir != first.private_git_dir
    for other in (again, fresh):
        assert (other.tree, other.commit, other.local_digest) == (
            first.tree,
            first.commit,
            first.local_digest,
        )
    repo.write("keep.txt", "one more change\n")
    changed, _ = build_baseline(repo.path, "include-local-changes")
    assert changed.tree != first.tree
    assert changed.local_digest != first.local_digest


def test_require_clean_refuses_a_dirty_tree(repo: Repo) -> None:
    repo.write("unstaged.txt", "changed\n")
    with pytest.raises(PatchboxError) as caught:
        build_baseline(repo.path)
    assert caught.value.code == ErrorCode.CONSENT_REQUIRED


def crlf_by_autocrlf(repo: Repo) -> None:
    repo.git("config", "core.autocrlf", "true")


def crlf_by_attributes(repo: Repo) -> None:
    repo.write(".gitattributes", "* text eol=crlf\n*.png binary\n")
    repo.commit("attributes")


@pytest.mark.parametrize("convert", [crlf_by_autocrlf, crlf_by_attributes])
def test_converting_repository_gives_the_bytes_on_disk(
    repo: Repo, convert: Callable[[Repo], None]
) -> None:
    convert(repo)
    repo.write("image.png", b"\x89PNG\r\n\x1a\n")
    repo.commit("image")
    for name in [*BASE, "image.png"]:
        (repo.path / name).unlink()
    repo.git("checkout", "--", ".")  # the user's git writes CRLF
    assert (repo.path / "keep.txt").read_bytes() == b"keep\r\n"
    assert repo.git("cat-file", "-p", "HEAD:keep.txt") == "keep"
    assert repo.git("status", "--porcelain") == ""

    report = check_health(repo.path)
    assert report.ok, report.reasons
    assert report.converting
    assert not report.dirty  # as the user's git status says
    baseline, _ = build_baseline(repo.path, "require-clean")
    files, _ = archive_files(baseline)
    assert files == work_tree_files(repo.path)
    assert files["keep.txt"] == (b"keep\r\n", False)
    assert files["image.png"] == (b"\x89PNG\r\n\x1a\n", False)
    assert baseline.tree != repo.git("rev-parse", "HEAD^{tree}")
    assert baseline.head == repo.head()

    repo.write("unstaged.txt", b"changed\r\n")
    repo.write("new.txt", b"new\r\nfile\n")
    report = check_health(repo.path)
    counts = report.counts
    assert (counts.staged_files, counts.unstaged_files, counts.untracked_files) == (0, 1, 1)
    with pytest.raises(PatchboxError) as caught:
        build_baseline(repo.path, "require-clean")
    assert caught.value.code == ErrorCode.CONSENT_REQUIRED
    baseline, _ = build_baseline(repo.path, "include-local-changes")
    files, _ = archive_files(baseline)
    assert files == work_tree_files(repo.path)
    assert files["new.txt"] == (b"new\r\nfile\n", False)


def test_unmerged_paths_are_seen_in_a_converting_repository(repo: Repo) -> None:
    crlf_by_autocrlf(repo)
    repo.git("checkout", "-q", "-b", "topic")
    repo.write("keep.txt", "topic\n")
    repo.commit("topic")
    repo.git("checkout", "-q", "main")
    repo.write("keep.txt", "main\n")
    repo.commit("main")
    assert repo.run("merge", "topic").returncode != 0
    (repo.git_dir / "MERGE_HEAD").unlink()  # only the unmerged index entries remain
    assert [r.code for r in check_health(repo.path).reasons] == ["UNMERGED_PATHS"]


# --- the user's own ignore and attributes files -------------------------------------------


def ignore_in_xdg_config(repo: Repo, home: Path) -> None:
    (home / ".config" / "git").mkdir(parents=True, exist_ok=True)
    (home / ".config" / "git" / "config").write_text("[core]\n\texcludesFile = ~/my-ignore\n")


def ignore_in_gitconfig(repo: Repo, home: Path) -> None:
    with (home / ".gitconfig").open("a") as handle:
        handle.write("[core]\n\texcludesFile = ~/my-ignore\n")


def ignore_in_repo_config(repo: Repo, home: Path) -> None:
    repo.git("config", "core.excludesFile", str(home / "my-ignore"))


def ignore_at_the_default_place(repo: Repo, home: Path) -> None:
    (home / ".config" / "git").mkdir(parents=True, exist_ok=True)
    (home / "my-ignore").rename(home / ".config" / "git" / "ignore")


@pytest.mark.parametrize(
    "configure",
    [ignore_in_xdg_config, ignore_in_gitconfig, ignore_in_repo_config, ignore_at_the_default_place],
)
def test_the_users_excludes_file_is_honoured(
    repo: Repo, configure: Callable[[Repo, Path], None]
) -> None:
    home = Path(os.environ["HOME"])
    (home / "my-ignore").write_text("*.env\n!kept-by-exclude.env\n")
    configure(repo, home)
    (repo.path / repo.git("rev-parse", "--git-path", "info/exclude")).write_text("!*.kept.env\n")
    repo.write(".gitignore", "*.log\nignored/\n!kept-by-gitignore.env\n")
    repo.commit("gitignore")
    for name in ("secret.env", "sub/x.env", "kept-by-gitignore.env", "a.kept.env"):
        repo.write(name, "SECRET=1\n")
    repo.write("kept-by-exclude.env", "x\n")
    ignored = {"secret.env", "sub/x.env"}
    assert set(repo.git("status", "--porcelain", "--ignored=matching").split("\n")) == {
        "?? a.kept.env",
        "?? kept-by-exclude.env",
        "?? kept-by-gitignore.env",
        "!! secret.env",
        "!! sub/x.env",
    }
    report = check_health(repo.path)
    assert report.counts.untracked_files == 3
    baseline, _ = build_baseline(repo.path, "include-local-changes")
    assert archive_files(baseline)[0] == work_tree_files(repo.path, skip=ignored)


def test_the_users_attributes_file_is_honoured(repo: Repo) -> None:
    home = Path(os.environ["HOME"])
    (home / ".config" / "git").mkdir(parents=True, exist_ok=True)
    (home / ".config" / "git" / "attributes").write_text("*.txt text eol=crlf\n")
    (repo.path / "keep.txt").unlink()
    repo.git("checkout", "--", "keep.txt")
    assert (repo.path / "keep.txt").read_bytes() == b"keep\r\n"
    assert repo.git("status", "--porcelain") == ""
    report = check_health(repo.path)
    assert (report.converting, report.dirty) == (True, False)
    baseline, _ = build_baseline(repo.path)
    assert archive_files(baseline)[0]["keep.txt"] == (b"keep\r\n", False)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("name", ["exclude", "attributes"])
def test_a_fifo_in_the_git_dir_is_not_read(repo: Repo, name: str) -> None:
    (repo.git_dir / "info" / name).unlink(missing_ok=True)
    os.mkfifo(repo.git_dir / "info" / name)
    report = check_health(repo.path)
    assert report.ok, report.reasons
    baseline, _ = build_baseline(repo.path)
    assert baseline.commit == repo.head()


def test_archive_stream_stops_cleanly_when_left_early(repo: Repo) -> None:
    repo.write("big.bin", os.urandom(3 << 20))
    baseline, _ = build_baseline(repo.path, "include-local-changes")
    with archive_stream(baseline) as chunks:
        assert len(next(iter(chunks))) > 0


# --- the user's repository is never written ----------------------------------------------


def plain(repo: Repo, tmp_path: Path) -> tuple[Repo, list[Path]]:
    return repo, [repo.path]


def worktree(repo: Repo, tmp_path: Path) -> tuple[Repo, list[Path]]:
    repo.git("worktree", "add", "-q", "-b", "side", str(tmp_path / "wt"))
    return Repo(tmp_path / "wt", repo.env), [repo.path, tmp_path / "wt"]


def separate(repo: Repo, tmp_path: Path) -> tuple[Repo, list[Path]]:
    other = base_repo(tmp_path / "sep", repo.env, "--separate-git-dir", str(tmp_path / "s.git"))
    return other, [other.path, tmp_path / "s.git"]


def converting(repo: Repo, tmp_path: Path) -> tuple[Repo, list[Path]]:
    crlf_by_attributes(repo)
    return repo, [repo.path]


def reftable(repo: Repo, tmp_path: Path) -> tuple[Repo, list[Path]]:
    other = base_repo(tmp_path / "rt", repo.env, "--ref-format=reftable")
    return other, [other.path]


def sha256(repo: Repo, tmp_path: Path) -> tuple[Repo, list[Path]]:
    other = base_repo(tmp_path / "sha256", repo.env, "--object-format=sha256")
    return other, [other.path]


@pytest.mark.parametrize("layout", [plain, worktree, separate, converting, reftable, sha256])
def test_the_users_repository_is_never_written(
    repo: Repo, tmp_path: Path, layout: Callable[[Repo, Path], tuple[Repo, list[Path]]]
) -> None:
    target, folders = layout(repo, tmp_path)
    target.git("stash", "push", "-q", "--include-untracked", "--allow-empty", check=False)
    target.write("keep.txt", "stashed change\n")
    target.git("stash", "push", "-q")
    dirty_everything(target)
    index = target.git_dir / "index"
    index_bytes = index.read_bytes()
    refs = refs_and_logs(target)
    before = {folder: snapshot(folder) for folder in folders}

    check_health(target.path)
    with pytest.raises(PatchboxError):
        build_baseline(target.path, "require-clean")
    baseline, _ = build_baseline(target.path, "include-local-changes")
    files, _ = archive_files(baseline)

    assert {folder: snapshot(folder) for folder in folders} == before
    assert index.read_bytes() == index_bytes
    assert refs_and_logs(target) == refs
    assert files["staged.txt"] == (b"staged after\n", False)
    assert "refs/patchbox" not in refs[0]


# --- a hostile repository configuration runs nothing on the host -------------------------

HOOKS = (
    "applypatch-msg",
    "pre-applypatch",
    "post-applypatch",
    "pre-commit",
    "pre-merge-commit",
    "prepare-commit-msg",
    "commit-msg",
    "post-commit",
    "pre-rebase",
    "post-checkout",
    "post-merge",
    "pre-push",
    "pre-receive",
    "update",
    "proc-receive",
    "post-receive",
    "post-update",
    "reference-transaction",
    "push-to-checkout",
    "pre-auto-gc",
    "post-rewrite",
    "sendemail-validate",
    "fsmonitor-watchman",
    "post-index-change",
    "p4-changelist",
    "p4-prepare-changelist",
    "p4-post-changelist",
    "p4-pre-submit",
)

COMMANDS = (
    "core.fsmonitor",
    "core.pager",
    "core.sshCommand",
    "core.editor",
    "core.askPass",
    "core.gitProxy",
    "core.alternateRefsCommand",
    "sequence.editor",
    "credential.helper",
    "diff.external",
    "diff.evil.textconv",
    "diff.evil.command",
    "merge.evil.driver",
    "filter.evil.clean",
    "filter.evil.smudge",
    "filter.evil.process",
    "gpg.program",
    "pager.status",
    "uploadpack.packObjectsHook",
)


def marker_script(folder: Path, name: str, markers: Path) -> str:
    script = folder / f"{name}.sh"
    script.write_text(f'#!/bin/sh\necho "$@" > "{markers / name}"\ncat\n')
    script.chmod(0o755)
    return str(script)


def hostile(tmp_path: Path, env: dict[str, str], *args: str) -> tuple[Repo, Path]:
    """A repository whose config, attributes and hooks would run a marker script for every
    command git could be made to run; returns it and the (empty) markers folder."""
    files: dict[str, bytes | str] = {"a.txt": "a\n", "b.txt": "b\n", "c.bin": "c\n"}
    repo = init(tmp_path / "hostile", files, *args, env=env)
    markers = tmp_path / "markers"
    scripts = tmp_path / "scripts"
    hooks = tmp_path / "hooks"
    for folder in (markers, scripts, hooks):
        folder.mkdir()
    for hook in HOOKS:
        shutil.copy(marker_script(scripts, f"hook-{hook}", markers), hooks / hook)
        shutil.copy(hooks / hook, repo.git_dir / "hooks" / hook)
    repo.git("config", "core.hooksPath", str(hooks))
    for key in COMMANDS:
        repo.git("config", key, marker_script(scripts, key, markers))
    repo.git("config", "filter.evil.required", "true")
    repo.git("config", "core.untrackedCache", "true")
    repo.git("config", "include.path", str(tmp_path / "included"))
    (tmp_path / "included").write_text(f"[core]\n\tfsmonitor = {scripts / 'core.fsmonitor.sh'}\n")
    # ``.gitattributes`` is written after the config: committing it ran nothing.
    repo.write(".gitattributes", "* filter=evil diff=evil merge=evil\n")
    return repo, markers


@pytest.mark.parametrize("refs", ["files", "reftable"])
def test_hostile_configuration_runs_nothing(tmp_path: Path, env: dict[str, str], refs: str) -> None:
    repo, markers = hostile(tmp_path, env, f"--ref-format={refs}")
    repo.write("a.txt", "modified\n")
    repo.write("d.txt", "untracked\n")
    (repo.path / "b.txt").unlink()
    home_config = Path(os.environ["HOME"]) / ".gitconfig"
    home_config.write_text(f"[core]\n\tfsmonitor = {tmp_path / 'scripts' / 'core.fsmonitor.sh'}\n")

    report = check_health(repo.path)
    assert report.ok, report.reasons
    assert report.converting  # the filter attribute
    assert (report.counts.unstaged_files, report.counts.untracked_files) == (2, 2)
    with pytest.raises(PatchboxError):
        build_baseline(repo.path, "require-clean")
    baseline, _ = build_baseline(repo.path, "include-local-changes")
    files, _ = archive_files(baseline)

    assert sorted(p.name for p in markers.iterdir()) == []
    assert files == work_tree_files(repo.path)  # no filter applied


def test_hostile_markers_do_fire_in_the_users_own_git(tmp_path: Path, env: dict[str, str]) -> None:
    """The markers of the test above work: the user's git, reading that config, runs them."""
    repo, markers = hostile(tmp_path, env)
    repo.write("a.txt", "modified\n")
    repo.run("status")
    assert (markers / "core.fsmonitor").is_file()
    repo.run("diff")
    assert (markers / "filter.evil.clean").is_file() or (markers / "filter.evil.process").is_file()
    repo.run("-c", "filter.evil.required=false", "commit", "-q", "--allow-empty", "-m", "x")
    assert (markers / "hook-pre-commit").is_file()


# --- random local states ------------------------------------------------------------------

FOLDERS = ("", "src/", "src/deep/", "dökü/", "a b/")
STEMS = ("f", "g", "ü", "файл", "名", "x y", "e")
CONTENTS = (b"", b"line\n", b"crlf\r\nline\r\n", b"no newline", b"\x00\x01bin\xff", b"z\n" * 50)


@dataclass
class Local:
    """The state a random sequence of local changes works on."""

    repo: Repo
    rng: random.Random
    tracked: list[str]
    fresh: Iterator[str]
    ignored: set[str] = field(default_factory=set)

    def content(self) -> bytes:
        return self.rng.choice(CONTENTS) + str(self.rng.randrange(1000)).encode()

    def flip(self, p: float) -> bool:
        return self.rng.random() < p


def stage_change(s: Local, target: str) -> None:
    s.repo.write(target, s.content())
    s.repo.git("add", "--", target)


def unstaged_change(s: Local, target: str) -> None:
    s.repo.write(target, s.content(), executable=s.flip(0.3))


def delete(s: Local, target: str) -> None:
    (s.repo.path / target).unlink()


def git_rm(s: Local, target: str) -> None:
    s.repo.git("rm", "-q", "-f", "--", target)


def git_mv(s: Local, target: str) -> None:
    new = next(s.fresh)
    (s.repo.path / new).parent.mkdir(parents=True, exist_ok=True)
    s.repo.git("mv", "--", target, new)
    s.tracked.append(new)


def chmod(s: Local, target: str) -> None:
    path = s.repo.path / target
    path.chmod(path.stat().st_mode ^ 0o111)


def add_file(s: Local, _: str) -> None:
    new = next(s.fresh)
    s.repo.write(new, s.content(), executable=s.flip(0.2))
    if s.flip(0.5):
        s.repo.git("add", "--", new)
        s.tracked.append(new)


def add_empty(s: Local, _: str) -> None:
    s.repo.write(next(s.fresh), b"")


def add_ignored(s: Local, _: str) -> None:
    name = s.rng.choice([f"{next(s.fresh)}.log", f"ignored/{next(s.fresh)}"])
    s.repo.write(name, b"ignored\n")
    s.ignored.add(name)


ON_TRACKED = (stage_change, unstaged_change, delete, git_rm, git_mv, chmod)
ANYWHERE = (add_file, add_empty, add_ignored)


def random_repo(rng: random.Random, root: Path, env: dict[str, str]) -> tuple[Repo, set[str]]:
    """A committed tree, then a random mix of local changes; returns the ignored paths."""
    names = [f"{d}{s}{i}.txt" for d in FOLDERS for s in STEMS for i in range(3)]
    rng.shuffle(names)
    tracked = names[: rng.randrange(4, 14)]
    repo = init(root, {".gitignore": "*.log\nignored/\n"}, env=env)
    if rng.random() < 0.25:
        repo.git("config", "core.autocrlf", "true")
    for name in tracked:
        repo.write(name, rng.choice(CONTENTS), executable=rng.random() < 0.2)
    repo.commit("tracked")
    local = Local(repo, rng, tracked, iter(names[len(tracked) :]))
    for _ in range(rng.randrange(1, 12)):
        present = sorted(n for n in local.tracked if (repo.path / n).exists())
        op = rng.choice(ON_TRACKED + ANYWHERE if present else ANYWHERE)
        op(local, rng.choice(present) if present else "")
    return repo, local.ignored


def expected_tree(repo: Repo, ignored: set[str]) -> Files:
    """The work tree without ``.git`` and without what the user's git ignores."""
    files = work_tree_files(repo.path)
    names = "\0".join(files).encode() + b"\0"
    out = repo.run("check-ignore", "--no-index", "-z", "--stdin", stdin=names).stdout
    by_git = {p.decode() for p in out.split(b"\0") if p}
    assert by_git == ignored
    return {name: value for name, value in files.items() if name not in by_git}


@pytest.mark.parametrize("seed", range(25))
def test_random_local_states(tmp_path: Path, env: dict[str, str], seed: int) -> None:
    rng = random.Random(seed)  # noqa: S311 - reproducible cases, not secrets
    repo, ignored = random_repo(rng, tmp_path / "repo", env)
    expected = expected_tree(repo, ignored)
    before = snapshot(repo.path)
    baseline, report = build_baseline(repo.path, "include-local-changes")
    files, _ = archive_files(baseline)
    assert snapshot(repo.path) == before
    assert files == expected
    assert report.ok
    assert (baseline.commit == repo.head()) == (
        baseline.tree == repo.git("rev-parse", "HEAD^{tree}")
    )
