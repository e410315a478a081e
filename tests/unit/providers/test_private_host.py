"""The plain-http rule: the API key crosses plain ``http`` only to a loopback host, or to a
host the operator names in ``provider.allow_insecure_http_hosts`` (a model server on the
host, reached from a container as ``host.docker.internal``). The default still refuses; the
named host is the only one allowed. Then a real provider sends its key to a real HTTP server
on one of this machine's non-loopback addresses, named in the list."""

from __future__ import annotations

import socket

import pytest

from controller.errors import UsageError
from controller.providers import ProviderConfig, open_provider
from tests.support.loopback import LoopbackServer
from tests.support.openai import KEY, PROMPT, READ, answer, key_free

PRIVATE = "http://host.docker.internal:11434/v1"


def table(**fields: object) -> dict[str, object]:
    return {"model": "m", "base_url": PRIVATE, "api_key": KEY, **fields}


def test_the_default_refuses_a_key_over_plain_http_to_a_private_host() -> None:
    with pytest.raises(UsageError, match="allow_insecure_http_hosts") as caught:
        ProviderConfig.from_mapping(table(), {})
    key_free(caught.value)
    assert ProviderConfig(model="m").allow_insecure_http_hosts == []


def test_a_named_host_is_allowed_and_only_that_host() -> None:
    allowed = ProviderConfig.from_mapping(
        table(allow_insecure_http_hosts=["Host.Docker.Internal"]), {}
    )
    assert allowed.base_url == PRIVATE
    assert allowed.api_key is not None
    assert allowed.api_key.get_secret_value() == KEY
    for other in (
        "http://other.internal:11434/v1",
        "http://docker.internal/v1",
        "http://evil.host.docker.internal/v1",
        "http://host.docker.internal.evil.example/v1",
    ):
        with pytest.raises(UsageError, match="only over https") as caught:
            ProviderConfig.from_mapping(
                table(base_url=other, allow_insecure_http_hosts=["host.docker.internal"]), {}
            )
        key_free(caught.value)
    # The URL may come from the environment; the list is the operator's table's.
    from_env = ProviderConfig.from_mapping(
        {"model": "m", "allow_insecure_http_hosts": ["10.0.0.5"]},
        {"OPENAI_BASE_URL": "http://10.0.0.5:8000/v1", "OPENAI_API_KEY": KEY},
    )
    assert from_env.base_url == "http://10.0.0.5:8000/v1"
    # Without a key nothing secret is sent: plain http needs no allowing.
    keyless = ProviderConfig.from_mapping({"model": "m", "base_url": PRIVATE}, {})
    assert keyless.api_key is None


@pytest.mark.parametrize("bad", ["", "a b", "http://x", "x/y", "-x", "x" * 254])
def test_a_listed_host_must_be_a_host_name(bad: str) -> None:
    with pytest.raises(UsageError, match=r"provider\.allow_insecure_http_hosts"):
        ProviderConfig.from_mapping(table(allow_insecure_http_hosts=[bad]), {})


def test_what_may_be_shown_has_no_key_and_no_path() -> None:
    config = ProviderConfig.from_mapping(
        table(
            base_url="http://host.docker.internal:11434/secret-route/v1",
            allow_insecure_http_hosts=["host.docker.internal"],
        ),
        {},
    )
    shown = config.public_view()
    assert shown == {
        "api": "chat",
        "endpoint": "http://host.docker.internal:11434",
        "model": "m",
        "key": "set",
    }
    assert KEY not in repr(shown)


def private_address() -> str:
    """One of this machine's IPv4 addresses that is not loopback (the one its default
    route, or else a private route, leaves from)."""
    for target in ("192.0.2.1", "10.255.255.254", "172.16.255.254"):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            try:
                probe.connect((target, 9))
            except OSError:
                continue
            address = str(probe.getsockname()[0])
        if not address.startswith("127."):
            return address
    msg = "this machine has no IPv4 address besides loopback"
    raise AssertionError(msg)


def test_a_provider_sends_its_key_to_a_named_private_host_over_plain_http() -> None:
    address = private_address()
    with LoopbackServer(address) as server:
        assert server.url.startswith(f"http://{address}:")
        values = {
            "base_url": f"{server.url}/v1",
            "api_key": KEY,
            "model": "test-model",
            "stream": False,
            "trust_env": False,
            "max_attempts": 1,
        }
        with pytest.raises(UsageError, match="only over https"):
            ProviderConfig.from_mapping(values, {})
        config = ProviderConfig.from_mapping(values | {"allow_insecure_http_hosts": [address]}, {})
        server.play(answer("chat", stream=False, calls=[READ]))
        with open_provider(config, PROMPT) as provider:
            turn = provider.next_turn([])
    assert [call.name for call in turn.tool_calls] == ["read_file"]
    (request,) = server.received
    assert request.path == "/v1/chat/completions"
    assert request.headers["authorization"] == f"Bearer {KEY}"


def test_the_refusal_carries_its_remedy_in_each_front_door_s_words() -> None:
    from controller.cli import hints as cli_hints
    from controller.errorinfo import Hint
    from controller.mcp import hints as mcp_hints
    from controller.service import hints as service_hints

    with pytest.raises(UsageError) as caught:
        ProviderConfig.from_mapping(table(), {})
    assert caught.value.hint == Hint(option="allow_insecure_http_hosts")
    words = cli_hints.remedy(caught.value.hint)
    assert words is not None
    assert "provider.allow_insecure_http_hosts" in words
    assert "--" not in words  # a configuration key, no flag: the key is never a flag's
    for door in (mcp_hints, service_hints):
        data = door.hint_data(caught.value.hint)
        assert data is not None
        assert "provider.allow_insecure_http_hosts" in data["text"]
    with pytest.raises(UsageError) as other:
        ProviderConfig.from_mapping(table(base_url="ftp://x"), {})
    assert other.value.hint is None
