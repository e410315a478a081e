"""A remedy (:class:`~controller.errors.Hint`) in the command line's words: the flag to pass
or the command to run. The engine names the option or operation; only this module names the
command line's."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from controller.errorinfo import Hint, HintAction, HintOption

OPTIONS: dict[HintOption, str] = {
    "include_local_changes": "pass --include-local-changes to include them",
    "merge": "to merge your changes three-way: patchbox apply {job} --merge",
    "allow_insecure_http": "pass --allow-insecure-http to allow it",
    "allow_insecure_http_hosts": (
        "to send the key to that host over plain http, name it in the host configuration's "
        "provider.allow_insecure_http_hosts"
    ),
}
"""Each option's words; ``{job}`` is the job the remedy is for."""

ACTIONS: dict[HintAction, str] = {
    "use_rebased": "apply or rebase job {job} instead (patchbox apply {job})",
    "build_image": "run 'patchbox image build'",
    "list_environments": "'patchbox env list' shows them",
    "use_environment": (
        "give the task an environment that provides what the check needs "
        "(docs/environments.md; 'patchbox env list' shows the built ones), "
        'or set "baseline_checks": false in the task to skip the run before the model'
    ),
}
"""Each operation's words; ``{job}`` is the job the remedy names."""


def remedy(hint: Hint | None) -> str | None:
    """The words for ``hint`` (None without one)."""
    if hint is None:
        return None
    if hint.option is not None:
        return OPTIONS[hint.option].format(job=hint.job_id or "JOB")
    if hint.action is not None:
        return ACTIONS[hint.action].format(job=hint.job_id or "JOB")
    return None


def with_remedy(message: str, hint: Hint | None) -> str:
    """``message``, then the remedy when there is one."""
    words = remedy(hint)
    return message if words is None else f"{message}; {words}"
