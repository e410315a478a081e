"""``compose.yaml`` as docs/service.md describes it: the controller reaches a model server on
the Docker host as ``host.docker.internal`` (``host-gateway``), and the provider example in
its comments is a valid ``[provider]`` table that sends the key over plain http to that host
only because it names it."""

from __future__ import annotations

import re
import tomllib
from typing import Any

import pytest
import yaml

from controller.errors import UsageError
from controller.providers.config import ProviderConfig
from tests.support.paths import REPO_ROOT

TEXT = (REPO_ROOT / "compose.yaml").read_text()


def controller() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(TEXT)
    service: dict[str, Any] = data["services"]["controller"]
    return service


def commented_provider() -> dict[str, Any]:
    found = re.search(r"^ *#   \[provider\]\n((?: *#   \S.*\n)+)", TEXT, re.MULTILINE)
    assert found is not None
    lines = [re.sub(r"^ *#   ", "", line) for line in found.group(1).splitlines()]
    table: dict[str, Any] = tomllib.loads("\n".join(lines))
    return table


def test_the_host_is_reachable_as_host_docker_internal() -> None:
    assert controller()["extra_hosts"] == ["host.docker.internal:host-gateway"]


def test_the_commented_provider_is_valid_and_needs_its_allowance() -> None:
    table = commented_provider()
    assert table["allow_insecure_http_hosts"] == ["host.docker.internal"]
    assert table["base_url"].startswith("http://host.docker.internal:")
    environ = {"OPENAI_API_KEY": "sk-compose-test"}
    config = ProviderConfig.from_mapping(table, environ)
    assert config.api_key is not None
    without = {k: v for k, v in table.items() if k != "allow_insecure_http_hosts"}
    with pytest.raises(UsageError, match="only over https"):
        ProviderConfig.from_mapping(without, environ)
