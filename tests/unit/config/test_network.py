"""Declared egress: the entries a check may write, the operator's ``[network]`` table, and
the refusal of an entry the operator (or a tenant's policy) does not allow."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from controller.config.checks import check_egress, job_checks
from controller.config.environment import EnvironmentSpec
from controller.config.host import HostConfig
from controller.config.network import (
    EgressRule,
    NetworkConfig,
    parse_rule,
    permitted,
    setup_rules,
)
from controller.config.task import CheckSpec, TaskSpec
from controller.errors import EgressNotAllowedError, ExitCode, UsageError, exit_code_for_error
from controller.sandbox.environment import environment_key

BAD_ENTRIES = [
    ("", "non-empty"),
    ("example.com", "port must be given"),
    ("example.com:", "port must be a number"),
    ("example.com:0", "port must be a number"),
    ("example.com:65536", "port must be a number"),
    ("example.com:080", "port must be a number"),
    ("example.com:-1", "port must be a number"),
    ("example.com:443x", "port must be a number"),
    (":443", "port must be given"),
    ("10.0.0.1:80", "not an address"),
    ("127.0.0.1:80", "not an address"),
    ("169.254.169.254:80", "not an address"),
    ("[::1]:443", "not an address"),
    ("::1:443", "not an address"),
    ("Example.com:443", "lower case"),
    ("localhost:80", "at least two labels"),
    ("*:443", "at least two labels"),
    ("*.com.:443", "at least two labels"),
    ("**.example.com:443", "at least two labels"),
    ("a.*.example.com:443", "at least two labels"),
    ("*example.com:443", "at least two labels"),
    ("-a.example.com:443", "at least two labels"),
    ("a_b.example.com:443", "at least two labels"),
    ("a..example.com:443", "at least two labels"),
    ("example.com.:443", "at least two labels"),
    ("exa mple.com:443", "printable ASCII"),
    ("example.com:443\n", "printable ASCII"),
    ("example.com\x00:443", "printable ASCII"),
    ("ex\u0430mple.com:443", "printable ASCII"),  # a Cyrillic look-alike
    ("user@example.com:443", "at least two labels"),
    ("example.com/path:443", "at least two labels"),
    ("http://example.com:443", "at least two labels"),
    ("a" * 64 + ".example.com:443", "at least two labels"),
    (("a" * 60 + ".") * 5 + "com:443", "printable ASCII"),
]


@pytest.mark.parametrize(("entry", "reason"), BAD_ENTRIES)
def test_a_bad_entry_is_refused_with_its_reason(entry: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        parse_rule(entry)
    with pytest.raises(ValidationError, match=reason):
        CheckSpec.model_validate({"argv": ["true"], "egress": [entry]})


@pytest.mark.parametrize(
    ("pattern", "request_host", "port", "allowed"),
    [
        ("files.example.com:443", "files.example.com", 443, True),
        ("files.example.com:443", "FILES.example.com.", 443, True),
        ("files.example.com:443", "files.example.com", 80, False),
        ("files.example.com:443", "x.files.example.com", 443, False),
        ("*.example.com:443", "a.example.com", 443, True),
        ("*.example.com:443", "a.b.example.com", 443, True),
        ("*.example.com:443", "example.com", 443, False),
        ("*.example.com:443", "evilexample.com", 443, False),
        ("*.example.com:443", "example.com.evil.net", 443, False),
        ("*.example.com:443", "10.0.0.1", 443, False),
    ],
)
def test_a_rule_matches_names_exactly_or_below_its_wildcard(
    pattern: str, request_host: str, port: int, allowed: bool
) -> None:
    assert parse_rule(pattern).matches(request_host, port) is allowed


def test_the_operator_allow_list_covers_entries_and_presets() -> None:
    network = NetworkConfig(
        allow=["*.example.com:443", "files.example.org:80"],
        presets={"pkgs": ["index.example.com:443", "files.example.com:443"]},
    )
    assert permitted(["a.example.com:443", "preset:pkgs", "files.example.org:80"], network) == (
        EgressRule("a.example.com", 443),
        EgressRule("index.example.com", 443),
        EgressRule("files.example.com", 443),
        EgressRule("files.example.org", 80),
    )
    # a wildcard entry is allowed only by a wildcard that covers it
    assert permitted(["*.b.example.com:443"], network) == (EgressRule("*.b.example.com", 443),)
    with pytest.raises(EgressNotAllowedError) as raised:
        permitted(["*.example.org:80", "example.com:443", "a.example.com:80"], network)
    assert raised.value.code == "EGRESS_NOT_ALLOWED"
    assert exit_code_for_error(raised.value.code) == ExitCode.USAGE
    for named in ("*.example.org:80", "example.com:443", "a.example.com:80"):
        assert named in raised.value.message
    with pytest.raises(UsageError, match="preset the host configuration does not define"):
        permitted(["preset:nope"], network)


def test_nothing_is_allowed_by_default_and_a_tenant_narrows_the_operator() -> None:
    with pytest.raises(EgressNotAllowedError, match=r"network\.allow"):
        permitted(["a.example.com:443"], NetworkConfig())
    network = NetworkConfig(allow=["*.example.com:443"])
    assert permitted(["a.example.com:443"], network, allow=["a.example.com:443"])
    with pytest.raises(EgressNotAllowedError, match="egress_allow"):
        permitted(["b.example.com:443"], network, allow=["a.example.com:443"])
    # a tenant's own list never widens the operator's
    with pytest.raises(EgressNotAllowedError):
        permitted(["a.example.org:443"], network, allow=["a.example.org:443"])


def test_a_preset_naming_a_refused_pair_names_its_preset() -> None:
    network = NetworkConfig(allow=["a.example.com:443"], presets={"p": ["b.example.com:443"]})
    with pytest.raises(EgressNotAllowedError, match=r"b\.example\.com:443 \(from preset:p\)"):
        permitted(["preset:p"], network)


def test_the_host_configuration_reads_the_network_table() -> None:
    data = tomllib.loads(
        """
[network]
allow = ["*.example.com:443"]
[network.presets]
pkgs = ["index.example.com:443"]
"""
    )
    config = HostConfig.model_validate(data)
    assert config.network.allow == ["*.example.com:443"]
    assert config.network.runsc_runtime == "runsc-egress"
    assert config.network.outside == "bridge"
    bad_tables: list[dict[str, Any]] = [
        {"network": {"allow": ["10.0.0.1:443"]}},
        {"network": {"presets": {"Bad Name": []}}},
        {"network": {"presets": {"p": ["preset:q"]}}},
        {"network": {"unknown": 1}},
    ]
    for bad in bad_tables:
        with pytest.raises(ValidationError):
            HostConfig.model_validate(bad)


def test_a_jobs_checks_are_refused_before_anything_starts(tmp_path: Path) -> None:
    task = TaskSpec.model_validate(
        {
            "prompt": "x",
            "checks": {
                "fine": {"argv": ["true"], "egress": ["a.example.com:443"]},
                "none": {"argv": ["true"]},
                "wide": {"argv": ["true"], "egress": ["*.example.com:443", "evil.example.net:443"]},
            },
        }
    )
    config = HostConfig.model_validate({"network": {"allow": ["a.example.com:443"]}})
    with pytest.raises(EgressNotAllowedError) as raised:
        job_checks(task, config, tmp_path, trust_repo_config=False)
    message = raised.value.message
    assert "checks.wide.egress" in message
    assert "*.example.com:443" in message
    assert "evil.example.net:443" in message
    assert "checks.fine" not in message
    wider = HostConfig.model_validate(
        {"network": {"allow": ["*.example.com:443", "evil.example.net:443"]}}
    )
    checks, _env = job_checks(task, wider, tmp_path, trust_repo_config=False)
    assert check_egress(checks, wider.network) == {
        "fine": (EgressRule("a.example.com", 443),),
        "wide": (EgressRule("*.example.com", 443), EgressRule("evil.example.net", 443)),
    }


def test_setup_steps_reach_their_environments_egress_or_the_operators_default(
    tmp_path: Path,
) -> None:
    """An environment's ``egress`` is held to ``network.allow`` like a check's; without one
    its setup gets ``network.setup_default`` (the operator's, presets expanded, not held to
    ``allow``); with neither, no network at all."""
    network = NetworkConfig(
        allow=["*.example.com:443"],
        presets={"pkgs": ["index.example.net:443", "files.example.net:443"]},
        setup_default=["preset:pkgs", "mirror.example.org:80"],
    )
    assert setup_rules(None, network) == (
        EgressRule("index.example.net", 443),
        EgressRule("files.example.net", 443),
        EgressRule("mirror.example.org", 80),
    )
    assert setup_rules([], network) == ()
    assert setup_rules(None, NetworkConfig()) == ()
    assert setup_rules(["a.example.com:443"], network) == (EgressRule("a.example.com", 443),)
    with pytest.raises(EgressNotAllowedError) as raised:
        setup_rules(["a.example.com:443", "preset:pkgs"], network)
    message = raised.value.message
    assert message.startswith("environment.egress declares")
    assert "index.example.net:443 (from preset:pkgs)" in message
    assert "a.example.com" not in message
    # a tenant's own list narrows an environment of its own
    with pytest.raises(EgressNotAllowedError, match="egress_allow"):
        setup_rules(["a.example.com:443"], network, allow=["b.example.com:443"])
    # before anything starts: the job's checks and environment are resolved together
    task = TaskSpec.model_validate(
        {"prompt": "x", "environment": {"setup": [["true"]], "egress": ["evil.example.net:443"]}}
    )
    config = HostConfig(network=network)
    with pytest.raises(EgressNotAllowedError, match=r"evil\.example\.net:443"):
        job_checks(task, config, tmp_path, trust_repo_config=False)


def test_the_setup_default_is_read_and_its_presets_must_exist() -> None:
    config = HostConfig.model_validate(
        tomllib.loads(
            '[network]\nsetup_default = ["preset:pkgs"]\n'
            '[network.presets]\npkgs = ["index.example.net:443"]\n'
        )
    )
    assert config.network.setup_default == ["preset:pkgs"]
    assert HostConfig().network.setup_default == []
    for bad in (["preset:nope"], ["10.0.0.1:443"], ["example.com"]):
        with pytest.raises(ValidationError):
            HostConfig.model_validate({"network": {"setup_default": bad}})
    with pytest.raises(ValidationError, match="setup_default"):
        HostConfig.model_validate({"network": {"setup_default": ["preset:nope"]}})
    # an environment's egress: entries as a check writes them, unset by default
    assert EnvironmentSpec().egress is None
    assert EnvironmentSpec(egress=[]).egress == []
    with pytest.raises(ValidationError):
        EnvironmentSpec.model_validate({"egress": ["127.0.0.1:80"]})


def test_the_environments_key_changes_with_what_its_setup_could_reach() -> None:
    spec = EnvironmentSpec(setup=[["true"]])
    none = environment_key("sha256:b", spec, [], "agent")
    assert none == environment_key("sha256:b", spec, [], "agent", [])
    one = environment_key("sha256:b", spec, [], "agent", ["a.example.com:443"])
    two = environment_key("sha256:b", spec, [], "agent", ["b.example.com:443", "a.example.com:443"])
    assert len({none, one, two}) == 3
    assert two == environment_key(
        "sha256:b", spec, [], "agent", ["a.example.com:443", "b.example.com:443"]
    )
