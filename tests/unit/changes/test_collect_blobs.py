"""The collected files are stored as blobs in the private git dir with one ``git
hash-object`` for all of them: the same object ids, bytes as they are (the repository's
filters never apply), whatever the path of the scratch files."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from controller.changes.collect import store_blobs
from controller.repo.baseline import Baseline, build_baseline, private_repo_of
from tests.support.git import init

CONTENTS = [
    b"plain text\n",
    b"windows\r\nline ends\r\n",
    b"",
    bytes(range(256)) * 40,
    b"../../etc/passwd",  # a symlink's target is stored the same way
    "unicode \u00e9\u4e2d\n".encode(),
]


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> Baseline:
    files = {
        # filters that would change the bytes if the private dir ever applied them
        ".gitattributes": "* text=auto eol=crlf\n*.bin filter=evil\n",
        "a.txt": "one\n",
    }
    repo = init(tmp_path_factory.mktemp("blobs") / "repo", files, message="init").path
    return build_baseline(repo)[0]


def _expected(data: bytes) -> str:
    out = subprocess.run(
        ["git", "hash-object", "--no-filters", "--stdin"],
        input=data,
        capture_output=True,
        check=True,
    )
    return out.stdout.decode().strip()


def _write(folder: Path) -> list[Path]:
    folder.mkdir(parents=True)
    paths = []
    for i, data in enumerate(CONTENTS):
        path = folder / (f"{i}.bin" if i % 2 else str(i))
        path.write_bytes(data)
        paths.append(path)
    return paths


@pytest.mark.parametrize("folder", ["plain", "a\nnewline", '"quoted'])
def test_every_file_becomes_its_blob(baseline: Baseline, tmp_path: Path, folder: str) -> None:
    paths = _write(tmp_path / folder)
    oids = store_blobs(private_repo_of(baseline), paths)
    assert oids == [_expected(data) for data in CONTENTS]
    private = private_repo_of(baseline)
    for oid, data in zip(oids, CONTENTS, strict=True):
        assert private.git("cat-file", "blob", oid) == data


def test_no_files_runs_nothing(baseline: Baseline) -> None:
    assert store_blobs(private_repo_of(baseline), []) == []


def test_a_missing_file_is_a_git_error(baseline: Baseline, tmp_path: Path) -> None:
    from controller.errors import GitError

    with pytest.raises(GitError):
        store_blobs(private_repo_of(baseline), [tmp_path / "absent"])
