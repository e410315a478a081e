"""``patchbox remote``: the job commands against a shared ``patchbox serve`` (for CI).

The server is ``--server URL`` or ``$PATCHBOX_SERVER``; the tenant's token is
``$PATCHBOX_TOKEN`` or the first line of ``--token-file FILE``, never a command-line value (a
process listing would show it). Each command returns ``(exit code, JSON-able data or None,
text)``; ``events`` and ``submit --wait`` write each event as it comes. Errors are the
service's codes (:func:`controller.errormap.service_error`); a service that does not answer is
``SERVICE_UNREACHABLE`` (exit 3). ``docs/service.md`` describes each command.

A job on a repository the service cannot see runs on a git bundle (``submit --bundle``):
the client uploads ``git bundle create - HEAD`` and ``remote apply`` downloads the job's
diff (no more than the change set's size limit) and applies it to the local repository as a
local job (:func:`controller.api.apply_remote_diff`): the bundle's commit is the baseline,
and every rule, check and the journal of ``patchbox apply`` hold. The service is not
trusted: config paths are written only when the user names them here (``--allow-path``, a
local ``--task`` file), never because the service says so.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

from pydantic import BaseModel, ConfigDict, StringConstraints, ValidationError

from controller.cli.remote_args import SERVER_VARIABLE, TOKEN_VARIABLE
from controller.cli.remote_text import event_texts, job_outcome, summary, write_line
from controller.errormap import describe_validation
from controller.errors import (
    ApplyConflictError,
    ChangesetInvalidError,
    ErrorCode,
    ExitCode,
    GitError,
    PatchboxError,
    ServiceError,
    ServiceUsageError,
    UsageError,
)
from controller.text import flag_text, hidden_characters, visible

if TYPE_CHECKING:
    from controller.client import ServiceClient
    from controller.remoteviews import Uploaded

Outcome = tuple[int, Mapping[str, object] | None, str]
Progress = Callable[[str], None]

MAX_INPUT_BYTES = 1024 * 1024
MAX_TOKEN_FILE_BYTES = 4096
MAX_ALLOW_PATH = 4096


# -- the connection --------------------------------------------------------------------------


def _token(args: argparse.Namespace) -> str:
    if args.token_file:
        from controller.config.inputfile import read_input_file

        raw = read_input_file(Path(args.token_file), "token file", MAX_TOKEN_FILE_BYTES)
        lines = raw.decode("utf-8", "replace").strip().splitlines()
        token = lines[0].strip() if lines else ""
        if not token:
            raise UsageError(f"the token file {args.token_file!r} is empty")
        return token
    token = os.environ.get(TOKEN_VARIABLE, "").strip()
    if not token:
        msg = f"no token: set {TOKEN_VARIABLE} or give --token-file FILE (never the token itself)"
        raise UsageError(msg)
    return token


def connect(args: argparse.Namespace) -> ServiceClient:
    from controller.client import ServiceClient

    server = (args.server or os.environ.get(SERVER_VARIABLE, "")).strip()
    if not server:
        raise UsageError(f"no service: give --server URL or set {SERVER_VARIABLE}")
    return ServiceClient(server, _token(args), allow_insecure_http=args.allow_insecure_http)


def run(args: argparse.Namespace, progress: Progress) -> Outcome:
    handlers: dict[str, Callable[[ServiceClient, argparse.Namespace, Progress], Outcome]] = {
        "submit": _submit,
        "jobs": _jobs,
        "show": _show,
        "attestations": _attestations,
        "events": _events,
        "apply": _apply,
        "revert": _revert,
        "discard": _action,
        "cancel": _action,
        "rebase": _action,
    }
    with connect(args) as client:
        if isinstance(getattr(args, "job", None), str):
            args.job = resolve_job(client, args.job)
        return handlers[args.remote_command](client, args, progress)


_FULL_ID = re.compile(r"\d{8}-\d{6}-[0-9a-f]{8}")
AMBIGUOUS_SHOWN = 10


def resolve_job(client: ServiceClient, ref: str) -> str:
    """The job ``ref`` names: a full id as it is; ``last``, the tenant's newest job; a
    prefix of exactly one of the tenant's jobs, that job (several: ``USAGE_ERROR`` naming
    them); anything else as it is (the service answers for an id it does not know)."""
    if _FULL_ID.fullmatch(ref):
        return ref
    rows = client.jobs()
    ids = [j["job_id"] for j in rows if isinstance(j, dict) and isinstance(j.get("job_id"), str)]
    if ref == "last":
        if not ids:
            raise UsageError("the tenant has no job on the service: there is no last one")
        return ids[-1]
    found = [i for i in ids if ref and i.startswith(ref)]
    if ref in found or not found:
        return ref
    if len(found) == 1:
        return found[0]
    shown = ", ".join(found[:AMBIGUOUS_SHOWN]) + (", ..." if len(found) > AMBIGUOUS_SHOWN else "")
    raise UsageError(f"{ref[:80]!r} names {len(found)} jobs ({shown}): give more of the id")


# -- the commands ---------------------------------------------------------------------------


def _read_object(path: str, what: str) -> dict[str, object]:
    from controller.config.inputfile import read_input_file

    raw = read_input_file(Path(path), what, MAX_INPUT_BYTES)
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise UsageError(f"the {what} is not valid JSON") from exc
    if not isinstance(data, dict):
        raise UsageError(f"the {what} must hold a JSON object")
    return data


def _submit(client: ServiceClient, args: argparse.Namespace, progress: Progress) -> Outcome:
    task = _read_object(args.task, "task file")
    calls = _read_object(args.calls, "calls file") if args.calls else None
    repo = _local_repo(args)
    if args.bundle:
        if args.include_local_changes:
            msg = "--bundle sends HEAD's commits only: commit the changes, or drop one option"
            raise UsageError(msg)
        uploaded = upload_head(client, repo, progress)
        progress(f"uploaded bundle {uploaded['bundle_id']} ({uploaded['size']} bytes)")
        accepted = client.submit(task, bundle=str(uploaded["bundle_id"]), calls=calls)
    else:
        try:
            accepted = client.submit(
                task, repo=repo, calls=calls, include_local_changes=args.include_local_changes
            )
        except ServiceError as exc:
            if exc.code is not ErrorCode.REPO_NOT_ALLOWED:
                raise
            msg = f"{exc.message}; for a repository the service cannot see, add --bundle"
            raise ServiceUsageError(msg, code=exc.code, status=exc.status) from exc
    job_id = str(accepted["job_id"])
    progress(f"job {job_id}: {accepted.get('status')} on {client.url}")
    if not args.wait:
        text = f"job {job_id}: {accepted.get('status')}\nnext: patchbox remote events {job_id}"
        return ExitCode.OK, accepted, text
    for event in client.events(job_id):
        for text in event_texts(event):
            progress(text)
    view = client.job(job_id)
    no_change_ok = bool(getattr(args, "no_change_ok", False))
    return job_outcome(view, no_change_ok=no_change_ok), view, summary(view)


def upload_head(client: ServiceClient, repo: Path, progress: Progress) -> Uploaded:
    """``git bundle create FILE HEAD`` of ``repo`` (through the hardened git runner) and its
    upload: ``{"bundle_id", "head", "size"}``."""
    from controller.repo.git import GitContext, run_git
    from controller.repo.layout import locate

    layout = locate(repo)
    with tempfile.TemporaryDirectory(prefix="patchbox-bundle-") as tmp:
        folder = Path(tmp)
        target = folder / "head.bundle"
        ctx = GitContext(cwd=folder, git_dir=layout.git_dir, work_tree=layout.top, home=folder)
        progress("making a git bundle of HEAD")
        try:
            run_git(ctx, "bundle", "create", "-q", str(target), "HEAD", spool=True)
        except GitError as exc:
            raise UsageError(f"cannot make a git bundle of {repo}: {exc.message}") from exc
        return client.upload_bundle(target)


def _jobs(client: ServiceClient, _args: argparse.Namespace, _progress: Progress) -> Outcome:
    import datetime as dt

    jobs = client.jobs()
    lines = []
    for job in jobs:
        if not isinstance(job, dict):  # not the service's shape: shown as it came
            lines.append(str(job))
            continue
        when = job.get("created")
        created = "-"
        if isinstance(when, int | float) and 0 <= when < 1e11:
            created = dt.datetime.fromtimestamp(when).astimezone().isoformat("T", "seconds")[:19]
        bundle = job.get("bundle")
        where = f"bundle {bundle.get('id')}" if isinstance(bundle, dict) else str(job.get("repo"))
        lines.append(f"{job.get('job_id')}  {job.get('status', '')!s:<16} {created:<19}  {where}")
    return ExitCode.OK, {"jobs": jobs}, "\n".join(lines) or "no jobs"


def _show(client: ServiceClient, args: argparse.Namespace, _progress: Progress) -> Outcome:
    view = client.job(args.job)
    if not getattr(args, "diff", False):
        return ExitCode.OK, view, summary(view)
    diff = _download_diff(client, args.job)
    text = summary(view) + ("\n" + diff.rstrip("\n") if diff.strip() else "\nno diff")
    # the service's own flags are its word: the diff as downloaded is flagged here
    from controller.changes.rules import control_lines

    flags = flag_text(c.model_dump() for c in control_lines(diff))
    hidden = hidden_characters(diff)
    if not flags and hidden:  # a diff that does not parse: no line to name
        shown = " ".join(hidden[:20])
        flags = [f"warning: the diff holds control, format or bidi characters: {shown}"]
    if flags:
        text += "\nin the diff as downloaded:\n" + "\n".join(flags)
    return ExitCode.OK, {**view, "diff": diff}, text


def _attestations(client: ServiceClient, args: argparse.Namespace, _p: Progress) -> Outcome:
    """The job's attestations, the diff as the service holds it and the service's public
    key, written for ``verify`` (the key as served: compare it with the operator's)."""
    files = {
        "provenance.intoto.jsonl": client.attestations(args.job),
        "diff.patch": _download_diff(client, args.job).encode("utf-8", "surrogateescape"),
        "provenance.pub": client.provenance_key().encode(),
    }
    folder = Path(args.out_dir)  # made once everything was read: nothing half written
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    written = [str(folder / name) for name in files]
    return ExitCode.OK, {"job_id": args.job, "written": written}, "\n".join(written)


def _download_diff(client: ServiceClient, job: str) -> str:
    """The job's diff from the service, no more than the change set's size limit
    (``CHANGESET_INVALID``, ``too_large``, and the rest not read, past it)."""
    from controller.changes.changeset import ChangesetLimits
    from controller.reasons import ChangesetReason

    def too_large(cap: int) -> ChangesetInvalidError:
        message = f"the job's diff is over {cap} bytes (max_diff_bytes): the rest was not read"
        return ChangesetInvalidError([ChangesetReason(code="too_large", message=message)])

    return client.diff(job, max_bytes=ChangesetLimits().max_diff_bytes, too_large=too_large)


def _events(client: ServiceClient, args: argparse.Namespace, _progress: Progress) -> Outcome:
    if args.last_event_id < 0:
        raise UsageError("--last-event-id takes an event id (0 or more)")
    for event in client.events(args.job, last_event_id=args.last_event_id):
        if args.json:  # ASCII: every control or non-ASCII character is a \u escape
            line = json.dumps({"id": event.id, "type": event.type, "data": event.data})
            write_line(line)
            continue
        for text in event_texts(event):
            write_line(visible(f"{event.id} {text}"))
    return ExitCode.OK, None, ""


def _action(client: ServiceClient, args: argparse.Namespace, _progress: Progress) -> Outcome:
    name = args.remote_command
    call = {
        "revert": client.revert,
        "discard": client.discard,
        "cancel": client.cancel,
        "rebase": client.rebase,
    }[name]
    data = call(args.job)
    text = f"job {data.get('job_id')}: {data.get('status')}"
    if data.get("parent"):
        text += f" (carries job {data.get('parent')} onto the repository as it is now)"
    if data.get("files"):
        text += f" ({len(data['files'])} file(s))"
    return ExitCode.OK, data, text


def _revert(client: ServiceClient, args: argparse.Namespace, progress: Progress) -> Outcome:
    """Reverts the job on the service; a bundle job, which the service cannot revert, by
    reverting what its ``remote apply`` applied here (``patchbox revert`` of each local job
    of it that is applied, in ``--repo`` or the current folder's repository)."""
    view = client.job(args.job)
    if not view.get("bundle"):
        if args.repo:
            raise UsageError("--repo: for a bundle job only; this job is in the service's tree")
        return _action(client, args, progress)
    from controller import api

    repo = _local_repo(args)
    local = [r for r in api.remote_applies(client.url, args.job, repo) if r.state == "applied"]
    if not local:
        where = f" to {repo}"
        msg = (
            f"job {args.job} ran on an uploaded bundle and its diff is not applied{where}: "
            f"there is nothing to revert (patchbox remote apply {args.job} applies it)"
        )
        raise UsageError(msg)
    reverted = []
    for record in local:
        progress(f"reverting local job {record.job_id} in {record.repo}")
        done, result = api.revert_job(record.job_id)
        files = [f.model_dump(mode="json") for f in result.files]
        reverted.append(
            {"local_job_id": done.job_id, "status": done.state, "files": files, "repo": done.repo}
        )
    data = {"job_id": args.job, "reverted": reverted}
    text = "\n".join(
        f"job {args.job}: local job {r['local_job_id']} reverted in {r['repo']}: "
        f"{len(r['files'])} file(s) restored"
        for r in reverted
    )
    return ExitCode.OK, data, text


def _apply(client: ServiceClient, args: argparse.Namespace, progress: Progress) -> Outcome:
    view = client.job(args.job)
    bundle = view.get("bundle")
    if not bundle:
        local = [f for f, v in LOCAL_APPLY_FLAGS.items() if getattr(args, v)]
        if local:
            msg = (
                f"{', '.join(local)}: for a bundle job only; this job is applied in the "
                "service's work tree"
            )
            raise UsageError(msg)
        data = client.apply(args.job)
        files = data.get("files") or []
        if data.get("already_applied"):
            return ExitCode.OK, data, f"job {args.job} already applied on the service"
        return ExitCode.OK, data, f"job {args.job} applied on the service: {len(files)} file(s)"
    ref = _bundle_ref(args.job, bundle)
    already = _applied_here(client, args)
    if already is not None:
        return already
    if view.get("status") != "awaiting_review":
        msg = f"job {args.job} is {view.get('status')}; only a job awaiting review is applied"
        raise UsageError(msg[:300])
    return _apply_here(client, args, ref, progress)


def _local_repo(args: argparse.Namespace) -> Path:
    """The local repository of a submit, or of a bundle job's apply or revert: ``--repo``,
    else the work tree the current folder is in (as ``patchbox run`` finds it)."""
    if args.repo:
        return Path(args.repo).resolve()
    from controller.repo.layout import enclosing_top

    try:
        return enclosing_top(Path.cwd())
    except PatchboxError as exc:
        msg = f"no --repo given, and {exc.message}"
        raise UsageError(msg) from exc


def _applied_here(client: ServiceClient, args: argparse.Namespace) -> Outcome | None:
    """A bundle job whose diff is applied to the local repository already (a local job
    of it is ``applied``): said so, nothing written; None otherwise."""
    from controller.api import remote_applies

    repo = _local_repo(args)
    applied = [r for r in remote_applies(client.url, args.job, repo) if r.state == "applied"]
    if not applied:
        return None
    local = applied[-1].job_id
    data = {
        "job_id": args.job,
        "local_job_id": local,
        "status": "applied",
        "already_applied": True,
        "files": [],
        "merged": [],
        "repo": str(repo),
    }
    text = (
        f"job {args.job} already applied to {repo} as local job {local}; nothing was "
        f"written\nundo: patchbox remote revert {args.job}"
    )
    return ExitCode.OK, data, text


LOCAL_APPLY_FLAGS = {
    "--repo": "repo",
    "--task": "task",
    "--allow-path": "allow_path",
    "--merge": "merge",
}
"""The options of ``remote apply`` that only a bundle job's local apply takes."""


class BundleRef(BaseModel):
    """A job view's ``bundle``: the uploaded bundle and the commit the job ran on."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]{1,128}$")]
    head: Annotated[str, StringConstraints(pattern=r"^([0-9a-f]{40}|[0-9a-f]{64})$")]


def _bundle_ref(job: str, bundle: object) -> BundleRef:
    try:
        return BundleRef.model_validate(bundle)
    except ValidationError as exc:
        fields = describe_validation(exc, subject="bundle")
        msg = f"the service's job {job} names a bundle that is not one ({fields})"
        raise ServiceError(msg) from None


def _allowed_paths(args: argparse.Namespace) -> list[str] | None:
    """The ``allowed_paths`` of the local apply: the local task file's, plus every
    ``--allow-path``; None (no limit beyond the protected paths, no config path) without
    either. What the service says of the job's task is never read."""
    allowed: list[str] | None = None
    if args.task:
        from controller.config.task import load_task

        allowed = load_task(Path(args.task)).allowed_paths
    for path in args.allow_path or []:
        if not path.strip() or len(path) > MAX_ALLOW_PATH:
            raise UsageError(f"--allow-path takes a path of 1 to {MAX_ALLOW_PATH} characters")
        allowed = [*(allowed or []), path]
    return allowed


def _apply_here(
    client: ServiceClient, args: argparse.Namespace, ref: BundleRef, progress: Progress
) -> Outcome:
    """A bundle job's diff, downloaded up to the change set's size limit, applied to the
    local repository as a local job (:func:`controller.api.apply_remote_diff`)."""
    from controller.api import RemoteOrigin, apply_remote_diff

    allowed = _allowed_paths(args)
    repo = _local_repo(args)
    diff = _download_diff(client, args.job)
    if not diff.strip():
        raise UsageError(f"job {args.job} has an empty diff: there is nothing to apply")
    progress(f"applying job {args.job} to {repo}")
    origin = RemoteOrigin(server=client.url, job_id=args.job, bundle=ref.id)
    try:
        record, result = apply_remote_diff(
            repo, diff, ref.head, origin=origin, allowed_paths=allowed, merge=args.merge
        )
    except ApplyConflictError as exc:
        if exc.hint is not None and exc.hint.option == "merge":  # the remote command, not apply
            again = f"patchbox remote apply {args.job} --repo {shlex.quote(str(repo))} --merge"
            exc.message += f"; to merge your changes three-way: {again}"
            exc.hint = None
        raise
    except ChangesetInvalidError as exc:
        if any(r.code in {"config_path", "not_allowed"} for r in exc.reasons):
            exc.message += (
                "; the service's word is not taken for which paths the job may write: name "
                "them with --allow-path PATH, or --task FILE whose allowed_paths does"
            )
        raise
    files = [f.model_dump(mode="json") for f in result.files]
    data = {
        "job_id": args.job,
        "local_job_id": record.job_id,
        "status": record.state,
        "files": files,
        "merged": result.merged,
        "repo": str(repo),
    }
    text = (
        f"job {args.job} applied to {repo} as local job {record.job_id}: {len(files)} file(s)"
        f"\nundo: patchbox remote revert {args.job} (or patchbox revert {record.job_id})"
        "\nthe service still lists the job awaiting review: patchbox remote discard " + args.job
    )
    return ExitCode.OK, data, text
