"""Remedies as data: an error that suggests a remedy carries it as a ``Hint`` (the engine's
name of an option or operation); each front door says it in its own words (a CLI flag or
command, an MCP server option, an HTTP field), and no module below the front doors names a
command-line flag or command."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any, get_args

import pytest

from controller.cli import hints as cli_hints
from controller.cli.parser import build_parser
from controller.errorinfo import Hint, HintAction, HintOption
from controller.errors import ErrorCode, PatchboxError
from controller.mcp import hints as mcp_hints
from controller.repo.baseline import build_baseline
from controller.service import hints as service_hints
from tests.support.jobs import make_repo
from tests.support.paths import REPO_ROOT

ROOT = REPO_ROOT
FRONT_DOORS = ("controller/cli/", "controller/mcp/", "controller/service/", "controller/main.py")
ARGV_ELEMENT = re.compile(r"--[\w-]+(=.*)?\Z")


# -- no module below the front doors names a flag or a command ----------------------------


def _parser_words() -> tuple[set[str], set[str]]:
    """Every option string of the command line (``--merge``, ...) and every command."""
    flags: set[str] = set()
    commands: set[str] = set()

    def walk(parser: Any) -> None:
        for action in parser._actions:
            flags.update(s for s in action.option_strings if s.startswith("--"))
            choices = getattr(action, "choices", None)
            for name, sub in choices.items() if isinstance(choices, dict) else ():
                if hasattr(sub, "_actions"):
                    commands.add(name)
                    walk(sub)

    walk(build_parser())
    flags -= {"--help", "--version", "--json"}
    return flags, commands


def _strings(tree: ast.Module) -> list[tuple[int, str]]:
    """The string constants of a module that are not docstrings (f-strings' parts too)."""
    docstrings: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list):
            for stmt in body:  # a docstring, or an attribute's docstring after it
                if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
                    docstrings.add(id(stmt.value))
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
    ]


def test_no_module_below_the_front_doors_names_a_flag_or_a_command() -> None:
    flags, commands = _parser_words()
    flag = re.compile("|".join(re.escape(f) + r"(?![\w-])" for f in sorted(flags, key=len)[::-1]))
    command = re.compile(r"\bpatchbox (" + "|".join(sorted(commands)) + r")\b")
    found = []
    for path in sorted((ROOT / "controller").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(FRONT_DOORS):
            continue
        for line, text in _strings(ast.parse(path.read_text(), rel)):
            if ARGV_ELEMENT.match(text):  # a program's own argument (git's --quiet)
                continue
            if command.search(text) or flag.search(text):
                found.append(f"{rel}:{line}: {text[:80]!r}")
    assert found == []


def test_the_scan_finds_a_flag_and_a_command() -> None:
    """The scan above is not blind: it sees a flag and a command in a message, not in a
    docstring."""
    source = '"""Run ``patchbox apply --merge``."""\nMSG = f"run patchbox apply {x} --merge"\n'
    strings = [text for _, text in _strings(ast.parse(source))]
    assert strings == ["run patchbox apply ", " --merge"]


# -- every remedy has each front door's words ----------------------------------------------


@pytest.mark.parametrize("door", [cli_hints, mcp_hints, service_hints], ids=["cli", "mcp", "http"])
def test_each_front_door_words_every_remedy(door: Any) -> None:
    assert set(door.OPTIONS) == set(get_args(HintOption))
    assert set(door.ACTIONS) == set(get_args(HintAction))


def test_the_words_of_each_front_door() -> None:
    merge = Hint(option="merge", job_id="job-7")
    assert cli_hints.remedy(merge) == (
        "to merge your changes three-way: patchbox apply job-7 --merge"
    )
    assert cli_hints.with_remedy("cannot apply", None) == "cannot apply"
    assert cli_hints.remedy(Hint(action="build_image")) == "run 'patchbox image build'"
    local = Hint(option="include_local_changes")
    assert mcp_hints.hint_data(local) == {
        "option": "include_local_changes",
        "text": "start `patchbox mcp` with --include-local-changes to include them",
    }
    assert service_hints.hint_data(local) == {
        "option": "include_local_changes",
        "text": 'send "include_local_changes": true with the job to include them',
    }
    assert service_hints.hint_data(None) is None
    assert mcp_hints.hint_data(Hint()) is None


# -- the engine's error carries the remedy; the front doors say it --------------------------


def test_the_baseline_of_a_dirty_tree_carries_the_option_not_a_flag(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    (repo / "app.py").write_text("# a local change\n")
    with pytest.raises(PatchboxError) as caught:
        build_baseline(repo)
    assert caught.value.code == ErrorCode.CONSENT_REQUIRED
    assert caught.value.hint == Hint(option="include_local_changes")
    assert "--" not in caught.value.message
    assert caught.value.info().model_dump(mode="json")["hint"] == {
        "option": "include_local_changes"
    }
