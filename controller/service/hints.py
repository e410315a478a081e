"""A remedy (:class:`~controller.errors.Hint`) in the HTTP API's words: the request field to
send; what only the service's operator can do is said to be the operator's."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from controller.errorinfo import Hint, HintAction, HintOption

OPTIONS: dict[HintOption, str] = {
    "include_local_changes": 'send "include_local_changes": true with the job to include them',
    "merge": (
        "POST /v1/jobs/{job}/apply does not merge: take the diff (GET /v1/jobs/{job}/diff) and "
        "merge it where the work tree is"
    ),
    "allow_insecure_http": "connect over https",
    "allow_insecure_http_hosts": (
        "the service's operator may name that host in provider.allow_insecure_http_hosts"
    ),
}
"""Each option's words; ``{job}`` is the job the remedy is for."""

ACTIONS: dict[HintAction, str] = {
    "use_rebased": "apply or rebase job {job} instead (POST /v1/jobs/{job}/apply)",
    "build_image": "the service's operator builds the sandbox image",
    "list_environments": "the service's operator lists the environments it offers",
    "use_environment": (
        "send the task with an environment that provides what the check needs "
        '(one the service offers, docs/environments.md), or with "baseline_checks": false'
    ),
}
"""Each operation's words; ``{job}`` is the job the remedy names."""


def hint_data(hint: Hint | None) -> dict[str, str] | None:
    """The ``hint`` of an error answer: the engine's names and the words (None without one)."""
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
