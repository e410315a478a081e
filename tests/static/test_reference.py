"""The user reference (docs/reference.md) names every error code, every key of every file a
user writes, every environment variable patchbox reads, and is linked from the README."""

from __future__ import annotations

import re

import pytest
from pydantic import BaseModel

from controller.config.host import HostConfig
from controller.config.limits import Limits
from controller.config.task import CheckSpec, TaskSpec
from controller.errors import ErrorCode
from controller.providers.config import ENV_NAMES, ProviderConfig
from tests.support.paths import REPO_ROOT

ROOT = REPO_ROOT
REFERENCE = (ROOT / "docs" / "reference.md").read_text()


def documented(name: str) -> bool:
    return re.search(rf"`{re.escape(name)}`", REFERENCE) is not None


@pytest.mark.parametrize("code", [c.value for c in ErrorCode])
def test_every_error_code_is_documented(code: str) -> None:
    assert re.search(rf"^\| `{code}` \|", REFERENCE, re.MULTILINE), code


@pytest.mark.parametrize(
    "model", [HostConfig, TaskSpec, CheckSpec, Limits, ProviderConfig], ids=lambda m: m.__name__
)
def test_every_key_is_documented(model: type[BaseModel]) -> None:
    missing = [name for name in model.model_fields if not documented(name)]
    assert missing == []


def test_every_environment_variable_is_documented() -> None:
    names = [*ENV_NAMES.values(), "PATCHBOX_HOME", "PATCHBOX_DEBIAN_MIRROR"]
    assert [n for n in names if not documented(n)] == []


def test_the_readme_links_the_reference() -> None:
    assert "docs/reference.md" in (ROOT / "README.md").read_text()


def test_help_names_the_reference(capsys: pytest.CaptureFixture[str]) -> None:
    from controller.cli.main import main

    with pytest.raises(SystemExit):
        main(["--help"])
    assert "docs/reference.md" in capsys.readouterr().out
