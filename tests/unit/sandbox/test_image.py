"""Building the sandbox image: caching by content, any python3 base, and the local base."""

from __future__ import annotations

import shutil
from pathlib import Path

from controller.paths import sandbox_image_dir
from controller.sandbox import image as image_mod
from controller.sandbox.image import context_digest, recipe_hash


def test_context_digest_follows_the_agent_sources(tmp_path: Path) -> None:
    copy = tmp_path / "ctx"
    shutil.copytree(sandbox_image_dir(), copy)
    before = context_digest(copy)
    assert context_digest(copy) == before
    server = copy / "patchbox_agent" / "server.py"
    server.write_text(server.read_text() + "\n# changed\n")
    assert context_digest(copy) != before


def test_recipe_hash_is_stable_and_sensitive() -> None:
    assert recipe_hash() == recipe_hash(dict(image_mod.LOCAL_BASE_RECIPE))
    changed = dict(image_mod.LOCAL_BASE_RECIPE, include=["python3"])
    assert recipe_hash(changed) != recipe_hash()
