"""Where the provider settings come from: each environment variable wins over the host
config's ``[provider]`` key for the same setting; a contradiction is an error naming both."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from controller.config.host import load_config
from controller.errors import UsageError
from controller.providers.config import ENV_NAMES, ProviderConfig
from tests.support.openai import KEY, key_free

TABLE: dict[str, Any] = {
    "api": "chat",
    "base_url": "https://config.example.com/v1",
    "api_key": "sk-from-the-config",
    "model": "config-model",
    "stream": True,
}
"""A ``[provider]`` table giving every setting an environment variable also sets."""

ENV = {
    "OPENAI_BASE_URL": "https://env.example.com/v1",
    "OPENAI_API_KEY": KEY,
    "PATCHBOX_MODEL": "env-model",
    "PATCHBOX_PROVIDER_API": "responses",
    "PATCHBOX_PROVIDER_STREAM": "false",
}
WON = {
    "base_url": "https://env.example.com/v1",
    "api_key": KEY,
    "model": "env-model",
    "api": "responses",
    "stream": False,
}
"""The setting each variable of ``ENV`` gives."""


def settings(config: ProviderConfig) -> dict[str, Any]:
    values = config.model_dump()
    values["api_key"] = config.api_key.get_secret_value() if config.api_key else None
    return {field: values[field] for field in ENV_NAMES}


def test_the_table_and_the_variables_cover_every_variable() -> None:
    assert sorted(ENV) == sorted(ENV_NAMES.values())
    assert sorted(WON) == sorted(ENV_NAMES) == sorted(TABLE)


@pytest.mark.parametrize(("field", "name"), sorted(ENV_NAMES.items()))
def test_each_variable_wins_over_its_key(field: str, name: str) -> None:
    config = ProviderConfig.from_mapping(TABLE, {name: ENV[name]})
    assert settings(config) == TABLE | {field: WON[field]}


def test_all_variables_win_together() -> None:
    assert settings(ProviderConfig.from_mapping(TABLE, ENV)) == WON


def test_without_variables_the_table_holds() -> None:
    assert settings(ProviderConfig.from_mapping(TABLE, {})) == TABLE


@pytest.mark.parametrize("name", sorted(ENV_NAMES.values()))
def test_an_empty_variable_counts_as_unset(name: str) -> None:
    assert settings(ProviderConfig.from_mapping(TABLE, {name: ""})) == TABLE


def test_a_variable_fills_what_the_table_leaves_out() -> None:
    config = ProviderConfig.from_mapping({"model": "config-model"}, {"OPENAI_API_KEY": KEY})
    assert settings(config) == {
        "api": "chat",
        "base_url": "https://api.openai.com/v1",
        "api_key": KEY,
        "model": "config-model",
        "stream": True,
    }
    assert ProviderConfig.from_mapping({}, {"PATCHBOX_MODEL": "m"}).model == "m"


def test_keys_without_a_variable_stay_the_tables() -> None:
    config = ProviderConfig.from_mapping(TABLE | {"max_attempts": 2, "stream": False}, ENV)
    assert config.max_attempts == 2
    assert config.stream is False  # PATCHBOX_PROVIDER_STREAM=false as well


def test_from_env_is_the_empty_table() -> None:
    assert ProviderConfig.from_env(ENV) == ProviderConfig.from_mapping({}, ENV)


@pytest.mark.parametrize(
    ("name", "value", "field"),
    [
        ("PATCHBOX_PROVIDER_API", "grpc", "api"),
        ("PATCHBOX_PROVIDER_STREAM", "maybe", "stream"),
        ("OPENAI_BASE_URL", "example.com", "base_url"),
        ("OPENAI_API_KEY", f"{KEY} x", "api_key"),
    ],
)
def test_a_bad_variable_is_named_not_the_key_it_overrides(
    name: str, value: str, field: str
) -> None:
    with pytest.raises(UsageError) as caught:
        ProviderConfig.from_mapping(TABLE, {name: value})
    assert f"{name}: " in caught.value.message
    assert f"provider.{field}" not in caught.value.message
    key_free(caught.value)
    with pytest.raises(UsageError, match=rf"provider\.{field}: "):
        ProviderConfig.from_mapping(TABLE | {field: value}, {})


def test_the_key_follows_the_url_it_is_sent_to() -> None:
    """An http URL from the environment and the config's key: the key's check names the key's
    source, wherever the URL came from."""
    with pytest.raises(UsageError, match=r"provider\.api_key: .*only over https") as caught:
        ProviderConfig.from_mapping(TABLE, {"OPENAI_BASE_URL": "http://example.com/v1"})
    key_free(caught.value)
    with pytest.raises(UsageError, match=r"OPENAI_API_KEY: .*only over https") as caught:
        ProviderConfig.from_mapping(
            TABLE | {"base_url": "http://example.com/v1"}, {"OPENAI_API_KEY": KEY}
        )
    key_free(caught.value)
    local = ProviderConfig.from_mapping(TABLE, {"OPENAI_BASE_URL": "http://127.0.0.1:8080/v1"})
    assert local.base_url == "http://127.0.0.1:8080/v1"


def test_api_key_env() -> None:
    """``api_key_env`` names where the key is; ``OPENAI_API_KEY`` set beside a different one
    is a contradiction, an error that names both."""
    table = {k: v for k, v in TABLE.items() if k != "api_key"}
    named = ProviderConfig.from_mapping(table | {"api_key_env": "LLM_KEY"}, {"LLM_KEY": "sk-2"})
    assert settings(named)["api_key"] == "sk-2"
    default = ProviderConfig.from_mapping(
        table | {"api_key_env": "OPENAI_API_KEY"}, {"OPENAI_API_KEY": KEY}
    )
    assert settings(default)["api_key"] == KEY
    for environ in ({"OPENAI_API_KEY": KEY, "LLM_KEY": "sk-2"}, {"OPENAI_API_KEY": KEY}):
        with pytest.raises(UsageError) as caught:
            ProviderConfig.from_mapping(table | {"api_key_env": "LLM_KEY"}, environ)
        assert caught.value.message == (
            "OPENAI_API_KEY is set but the host config's provider.api_key_env names LLM_KEY: "
            "the key would come from two variables; unset OPENAI_API_KEY or remove "
            "provider.api_key_env"
        )
        key_free(caught.value)
    with pytest.raises(UsageError, match="LLM_KEY: "):
        ProviderConfig.from_mapping(table | {"api_key_env": "LLM_KEY"}, {"LLM_KEY": "a b"})


def test_no_model_anywhere() -> None:
    with pytest.raises(UsageError) as caught:
        ProviderConfig.from_mapping({"api": "chat"}, {"OPENAI_API_KEY": KEY})
    assert caught.value.message == (
        "no model configured: set PATCHBOX_MODEL or the host config's provider.model"
    )


def test_through_the_host_config_file(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(
        '[provider]\napi = "chat"\nbase_url = "https://config.example.com/v1"\n'
        'model = "config-model"\nstream = true\n'
    )
    table = load_config(path).provider
    config = ProviderConfig.from_mapping(
        table, {"PATCHBOX_MODEL": "env-model", "PATCHBOX_PROVIDER_STREAM": "0"}
    )
    assert (config.model, config.stream, config.api) == ("env-model", False, "chat")
