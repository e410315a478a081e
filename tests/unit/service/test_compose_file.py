"""``compose.yaml`` as docs/service.md describes it: the controller reaches a model server on
the Docker host as ``host.docker.internal`` (``host-gateway``), and the provider example in
its comments is a valid ``[provider]`` table that sends the key over plain http to that host
only because it names it. Its ``replicas`` profile: PostgreSQL, built, and two replicas with
the controller's hardening, names of their own and one state volume; the ``[service]`` lines
its comments give are a valid table naming that database."""

from __future__ import annotations

import re
import tomllib
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from controller.errors import UsageError
from controller.providers.config import ProviderConfig
from controller.service.config import ServiceConfig
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


# -- the `replicas` profile -----------------------------------------------------------------

REPLICAS = ("replica-a", "replica-b")
HARDENING = (
    "image",
    "build",
    "user",
    "group_add",
    "read_only",
    "tmpfs",
    "cap_drop",
    "security_opt",
    "extra_hosts",
    "stop_grace_period",
    "restart",
)
"""What a replica takes from ``controller`` unchanged."""


def services() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(TEXT)
    found: dict[str, Any] = data["services"]
    return found


def commented_service_table() -> dict[str, Any]:
    found = re.search(r"^ *#   \[service\]\n((?: *#   \S.*\n)+)", TEXT, re.MULTILINE)
    assert found is not None
    lines = [re.sub(r"^ *#   ", "", line) for line in found.group(1).splitlines()]
    table: dict[str, Any] = tomllib.loads("[service]\n" + "\n".join(lines))
    return table


def test_the_default_services_are_the_controller_alone() -> None:
    always = [name for name, service in services().items() if "profiles" not in service]
    assert always == ["controller"]
    for name in ("postgres", *REPLICAS):
        assert services()[name]["profiles"] == ["replicas"]
    data: dict[str, Any] = yaml.safe_load(TEXT)
    assert set(data["volumes"]) == {"state"}  # `up` without the profile makes no other


def test_the_replicas_have_the_controllers_hardening_and_names_of_their_own() -> None:
    every = services()
    hostnames = set()
    for name in REPLICAS:
        replica = every[name]
        for key in HARDENING:
            assert replica[key] == controller()[key], (name, key)
        assert replica["read_only"] is True
        assert replica["cap_drop"] == ["ALL"]
        assert replica["security_opt"] == ["no-new-privileges:true"]
        assert replica["depends_on"] == {"postgres": {"condition": "service_healthy"}}
        hostnames.add(replica["hostname"])
    assert len(hostnames | {controller()["hostname"]}) == 3
    ports = {every[name]["ports"][0] for name in REPLICAS} | {controller()["ports"][0]}
    assert len({port.rsplit(":", 2)[1] for port in ports}) == 3  # the host ports differ


def test_the_replicas_share_the_state_volume_the_mounts_and_the_repositories() -> None:
    every = services()
    volumes = [every[name]["volumes"] for name in REPLICAS]
    assert volumes[0] == volumes[1]
    assert "state:/var/lib/patchbox" in volumes[0]
    assert "state:/var/lib/patchbox" in every["postgres"]["volumes"]
    shared = set(controller()["volumes"]) - {
        "${PATCHBOX_SERVICE_CONFIG:-./service.toml}:/etc/patchbox/config.toml:ro"
    }
    assert shared <= set(volumes[0])
    assert "${PATCHBOX_REPLICAS_CONFIG:-./replicas.toml}:/etc/patchbox/config.toml:ro" in volumes[0]
    for name in REPLICAS:
        environment = every[name]["environment"]
        assert environment["PATCHBOX_HOME"] == "/var/lib/patchbox"
        assert environment["PGPASSWORD"] == every["postgres"]["environment"]["POSTGRES_PASSWORD"]


def test_the_replicas_configuration_names_the_postgres_service() -> None:
    table = commented_service_table()
    config = ServiceConfig.model_validate(table["service"])
    assert config.state == "postgres"
    url = urlsplit(config.database or "")
    environment = services()["postgres"]["environment"]
    assert (url.hostname, url.port) == ("postgres", 5432)
    assert url.username == environment["POSTGRES_USER"]
    assert url.path == f"/{environment['POSTGRES_DB']}"
    assert url.password is None  # it comes from PGPASSWORD


def test_postgres_is_built_hardened_and_unpublished() -> None:
    postgres = services()["postgres"]
    build = postgres["build"]
    dockerfile = REPO_ROOT / "compose" / build["dockerfile"]
    assert build["context"] == "${PATCHBOX_POSTGRES_BUILD_CONTEXT:-./compose}"
    text = dockerfile.read_text()
    assert re.search(r"^FROM \$\{BASE_IMAGE\}$", text, re.MULTILINE)
    assert "apt-get install" in text
    assert "BASE_IMAGE" in build["args"]
    assert postgres["image"].startswith("${PATCHBOX_POSTGRES_IMAGE:-")
    assert postgres["user"] == controller()["user"]  # non-root
    assert postgres["read_only"] is True
    assert postgres["cap_drop"] == ["ALL"]
    assert postgres["security_opt"] == ["no-new-privileges:true"]
    assert "ports" not in postgres
    entrypoint = (REPO_ROOT / "compose" / "postgres-entrypoint.sh").read_text()
    assert "--auth-local=scram-sha-256 --auth-host=scram-sha-256" in entrypoint
    assert "host all all 0.0.0.0/0 scram-sha-256" in entrypoint  # a password from anywhere
