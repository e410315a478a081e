"""The ``env`` commands: build, list, show and prune project environment images.

Each returns ``(exit code, JSON-able data, text)``; :mod:`controller.cli.main` prints them.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from controller.errors import ErrorCode, ExitCode, PatchboxError, UsageError

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable

    from controller.sandbox.envimages import EnvImage

Outcome = tuple[int, Mapping[str, object], str]


def cmd_env_build(args: argparse.Namespace, progress: Callable[[str], None]) -> Outcome:
    """Builds the task's environment from the repository's baseline (nothing else runs)."""
    from controller.config.checks import resolve_environment
    from controller.config.host import load_config
    from controller.config.network import setup_rules
    from controller.config.task import load_task
    from controller.repo.baseline import build_baseline
    from controller.sandbox.dockerclient import connect
    from controller.sandbox.envbuild import EnvironmentBuilder, SetupEgress
    from controller.sandbox.labels import current_identity, new_job_id
    from controller.signals import cancel_on_signals

    task = load_task(Path(args.task))
    config = load_config(Path(args.config) if args.config else None)
    environment = resolve_environment(task, config)
    if environment is None:
        msg = 'the task has no environment: add an "environment" block or name one'
        raise UsageError(msg)
    baseline, _report = build_baseline(
        Path(args.repo),
        "include-local-changes" if args.include_local_changes else "require-clean",
    )
    rules = setup_rules(environment.egress, config.network)
    build_id = new_job_id()
    egress = SetupEgress(
        rules,
        name=f"patchbox-setup-{build_id}",
        labels=current_identity().labels(build_id, "egress"),
        outside=config.network.outside,
    )
    client = connect()
    builder = EnvironmentBuilder(client, progress, config.ca_bundle, egress)
    cancel = threading.Event()
    try:
        with cancel_on_signals(lambda _reason: cancel.set(), progress) as cancellation:
            built = builder.ensure(environment, baseline, cancel=cancel)
    except PatchboxError as exc:
        if cancellation.exit_code is None:
            raise
        error = {"code": str(ErrorCode.CANCELLED), "message": cancellation.reason or exc.message}
        return cancellation.exit_code, {"error": error}, "the environment build was cancelled"
    finally:
        client.close()
    data = {
        "id": built.tag.split(":", 1)[1],
        "tag": built.tag,
        "image_id": built.image_id,
        "key": built.key,
        "base": built.base,
        "built": built.built,
        "seconds": round(built.seconds, 3),
        "steps": built.steps,
        "egress": [r.text() for r in rules],
        "network": [c.as_dict() for c in built.network],
    }
    state = f"built in {built.seconds:.1f} s" if built.built else "up to date"
    return ExitCode.OK, data, f"{built.tag} {state} (base {built.base})"


def _line(env: EnvImage) -> str:
    size = env["size_bytes"] / 1e6
    setup = len(env["spec"].get("setup", []))
    when = env["created"][:19]
    return f"{env['id']}  {when}  {size:8.1f} MB  base {env['base']}  {setup} setup steps"


def cmd_env_list(_args: argparse.Namespace) -> Outcome:
    from controller.sandbox.dockerclient import connect
    from controller.sandbox.envimages import list_environments

    found = list_environments(connect())
    text = "\n".join(_line(e) for e in found) or "no environments"
    return ExitCode.OK, {"environments": found}, text


def cmd_env_show(args: argparse.Namespace) -> Outcome:
    from controller.sandbox.dockerclient import connect
    from controller.sandbox.envimages import find_environment

    env = find_environment(connect(), args.id)
    spec = env["spec"]
    lines = [
        f"environment {env['id']} ({env['tag']})",
        f"image: {env['image_id']}",
        f"base: {env['base']}",
        f"created: {env['created']}",
        f"size: {env['size_bytes'] / 1e6:.1f} MB",
        f"key: {env['key']}",
    ]
    lines += [f"setup {i + 1}: {' '.join(step)}" for i, step in enumerate(spec.get("setup", []))]
    lines += [f"input: {p}" for p in spec.get("inputs", [])]
    lines += [f"env: {name}" for name in spec.get("env", [])]
    return ExitCode.OK, env, "\n".join(lines)


def cmd_env_prune(_args: argparse.Namespace) -> Outcome:
    from controller.sandbox.dockerclient import connect
    from controller.sandbox.envimages import prune_environments

    removed, kept = prune_environments(connect())
    text = f"removed {len(removed)} environment(s)"
    if kept:
        text += f"; kept {len(kept)} in use: {', '.join(kept)}"
    return ExitCode.OK, {"removed": removed, "kept": kept}, text
