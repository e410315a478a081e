"""A remedy (:class:`~controller.errors.Hint`) in an MCP client's words. The session's
options are the server's start options (its user sets them in the client's configuration);
applying, building and listing happen on the host."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from controller.errorinfo import Hint, HintAction, HintOption

OPTIONS: dict[HintOption, str] = {
    "include_local_changes": "start `patchbox mcp` with --include-local-changes to include them",
    "merge": "merge them on the host with `patchbox apply {job} --merge`",
    "allow_insecure_http": "plain http must be allowed explicitly on the host",
    "allow_insecure_http_hosts": (
        "the host's operator may name that host in the host configuration's "
        "provider.allow_insecure_http_hosts"
    ),
}
"""Each option's words; ``{job}`` is the job the remedy is for."""

ACTIONS: dict[HintAction, str] = {
    "use_rebased": "apply or rebase job {job} instead, on the host (`patchbox apply {job}`)",
    "build_image": "build it on the host with `patchbox image build`",
    "list_environments": "`patchbox env list` on the host shows them",
    "use_environment": (
        "give the task an environment that provides what the check needs "
        '(docs/environments.md), or set "baseline_checks": false in the task'
    ),
}
"""Each operation's words; ``{job}`` is the job the remedy names."""


def hint_data(hint: Hint | None) -> dict[str, str] | None:
    """The ``hint`` of a tool error: the engine's names and the words (None without one)."""
    if hint is None:
        return None
    if hint.option is not None:
        text = OPTIONS[hint.option].format(job=hint.job_id or "JOB")
    elif hint.action is not None:
        text = ACTIONS[hint.action].format(job=hint.job_id or "JOB")
    else:
        return None
    names = {"option": hint.option, "action": hint.action, "job_id": hint.job_id}
    return {**{k: v for k, v in names.items() if v is not None}, "text": text}
