"""Where a sandbox's baseline is named before it is bind-mounted: ``PATCHBOX_MOUNT_DIR``
when set (a controller in a container), else a shared temp folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.errors import ErrorCode, NotReadyError
from controller.paths import mount_staging_root


def test_the_named_mount_folder_is_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATCHBOX_MOUNT_DIR", str(tmp_path))
    assert mount_staging_root() == tmp_path
    monkeypatch.delenv("PATCHBOX_MOUNT_DIR")
    assert mount_staging_root() != tmp_path


@pytest.mark.parametrize("kind", ["relative", "missing", "file"])
def test_a_bad_mount_folder_is_not_ready(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    bad = {"relative": "var/tmp", "missing": str(tmp_path / "nope"), "file": str(tmp_path / "f")}
    (tmp_path / "f").write_text("x")
    monkeypatch.setenv("PATCHBOX_MOUNT_DIR", bad[kind])
    with pytest.raises(NotReadyError) as caught:
        mount_staging_root()
    assert caught.value.code == ErrorCode.ENVIRONMENT_NOT_READY
    assert "PATCHBOX_MOUNT_DIR" in str(caught.value)
    assert not (tmp_path / "nope").exists()
