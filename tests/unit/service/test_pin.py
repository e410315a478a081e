"""``patchbox serve`` with two tenants, attacked over real HTTP: tenant alpha puts a symbolic
link to tenant beta's repository where its own was (while its job is queued, while the job
reads it, between the decision and an apply, revert or discard), or points its git data
(``.git`` file, ``commondir``, alternates) into beta's root. Each attack ends with
``REPO_NOT_ALLOWED``; beta's work tree is byte for byte as it was, and nothing of beta's
(its files, its HEAD id) reaches anything alpha can read."""

from __future__ import annotations

from pathlib import Path

from tests.support.jobs import APP, make_repo
from tests.support.service import serving, write_config
from tests.support.service_pin import BETA_FILES, beta_marks, error_of, submit

# -- at submit: no Docker ----------------------------------------------------------------


def test_submit_refuses_links_below_the_root_and_git_data_in_another_root(
    tmp_path: Path,
) -> None:
    beta = make_repo(tmp_path / "beta" / "repo", BETA_FILES)
    alpha_root = tmp_path / "alpha"
    own = make_repo(alpha_root / "own")
    with serving(write_config(tmp_path, workers=0)) as running:
        alpha = running.client("alpha")
        (alpha_root / "to-beta").symlink_to(beta, target_is_directory=True)
        (alpha_root / "to-own").symlink_to(own, target_is_directory=True)
        (alpha_root / "beta-root").symlink_to(beta.parent, target_is_directory=True)
        for path, part in (
            (alpha_root / "to-beta", "(to-beta)"),
            (alpha_root / "to-own", "(to-own)"),
            (alpha_root / "beta-root" / "repo", "(beta-root)"),
        ):
            status, code, message = error_of(submit(alpha, path))
            assert (status, code) == (403, "REPO_NOT_ALLOWED"), path
            assert f"goes through a symbolic link below its repository root {part}" in message
        # git data in beta's root: a .git file, a linked worktree's commondir, alternates
        gitfile = alpha_root / "gitfile"
        gitfile.mkdir()
        (gitfile / "app.py").write_text(APP)
        (gitfile / ".git").write_text(f"gitdir: {beta / '.git'}\n")
        linked = make_repo(alpha_root / "linked")
        (linked / ".git" / "commondir").write_text(f"{beta / '.git'}\n")
        borrowing = make_repo(alpha_root / "borrowing")
        alternates = borrowing / ".git" / "objects" / "info" / "alternates"
        alternates.write_text(f"{beta / '.git' / 'objects'}\n")
        for path, what in (
            (gitfile, "the git dir its .git file names"),
            (linked, "the common git dir its commondir names"),
            (borrowing, "objects/info/alternates"),
        ):
            response = submit(alpha, path)
            status, code, message = error_of(response)
            assert (status, code) == (403, "REPO_NOT_ALLOWED"), path
            assert f"keeps git data outside the repo_roots of tenant 'alpha' ({what})" in message
            for mark in beta_marks(beta):
                assert mark not in response.text
        missing = error_of(submit(alpha, alpha_root / "gone"))
        assert missing[:2] == (400, "NOT_A_REPOSITORY")
        assert alpha.get("/v1/jobs").json() == {"jobs": []}
        assert submit(alpha, own).status_code == 202  # the roots themselves still work
