"""A typed Python client of ``patchbox serve`` on httpx (``docs/service.md``).

.. code-block:: python

    with ServiceClient("https://patchbox.example", token) as service:
        job_id = service.submit(task, repo="/srv/repos/alpha/app", calls=calls)["job_id"]
        for event in service.events(job_id):
            print(event.id, event.type, event.data)
        print(service.job(job_id)["status"])

Every error answer of the service (``{"error": {"code", "message"}}``) is raised as
:class:`controller.errors.ServiceError` with the service's code and HTTP status
(:class:`controller.errors.ServiceUsageError`, exit status 2, when the request itself was
wrong: a bad token, another tenant's job, a malformed body); a service that does not answer
is :class:`controller.errors.ServiceUnreachableError` (``SERVICE_UNREACHABLE``). The token is
sent in the ``Authorization`` header only and never appears in a message.

A service is not trusted with this process either: every answer is read up to a bound
(:data:`MAX_ANSWER_BYTES`, :data:`MAX_ERROR_BYTES`, one event :data:`MAX_EVENT_BYTES`, a
diff the caller's ``max_bytes``) and no further, compressed answers are refused, and plain
``http`` is refused to a host that is not loopback unless the caller allows it
(``allow_insecure_http``): the token and the diffs would cross the network in clear.
"""

from __future__ import annotations

import ipaddress
import json
import re
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Self, cast

import httpx

from controller.errorinfo import Hint
from controller.errormap import map_service_error, service_error
from controller.errors import (
    ErrorCode,
    PatchboxError,
    ServiceError,
    ServiceUnreachableError,
    UsageError,
)
from controller.jobs.records import ACTIVE
from controller.remoteviews import (
    Accepted,
    Health,
    JobRow,
    RemoteJob,
    SubmitBody,
    Uploaded,
)

PENDING = ACTIVE | {"queued"}
"""A service job's states while it is queued or running."""

CONNECT_SECONDS = 10.0
READ_SECONDS = 120.0
"""The longest silence of an answer; an event stream sends a keep-alive every 15 s."""
UPLOAD_SECONDS = 3600.0
EVENT_RETRIES = 5
"""Reconnections of an event stream in a row without a new event before giving up."""
MAX_ANSWER_BYTES = 32 * 1024 * 1024
"""The largest answer read (a job's object holds its diff, at most 8 MiB for the engine)."""
MAX_ERROR_BYTES = 64 * 1024
"""The largest error answer read; a longer one is not the service's error shape."""
MAX_EVENT_BYTES = 1024 * 1024
"""The longest line of an event stream."""


@dataclass(frozen=True)
class Event:
    """One server-sent event of a job: its id (1, 2, ...), type and data."""

    id: int
    type: str
    data: dict[str, object]
    """The event's JSON object, its values as the service sent them."""


def _token(token: str) -> str:
    token = token.strip()
    if not token:
        raise UsageError("the service token is empty")
    if any(ord(c) < 0x21 or ord(c) > 0x7E for c in token):
        raise UsageError("the service token must be printable ASCII without spaces")
    return token


def _loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _base_url(url: str, *, allow_insecure_http: bool = False) -> httpx.URL:
    try:
        parsed = httpx.URL(url.strip())
    except (httpx.InvalidURL, TypeError) as exc:
        msg = "the service URL is not valid: give http(s)://HOST[:PORT]"
        raise UsageError(msg) from exc
    if parsed.scheme not in {"http", "https"} or not parsed.host:
        msg = f"the service URL must be http(s)://HOST[:PORT], not {url[:100]!r}"
        raise UsageError(msg)
    if parsed.userinfo:
        raise UsageError("the service URL must not hold a user or password; use the token")
    if parsed.scheme == "http" and not allow_insecure_http and not _loopback(parsed.host):
        msg = (
            f"plain http to {parsed.host[:100]!r}, which is not loopback, would send the token "
            "and take the diffs in clear: use https, or allow plain http on a network you trust"
        )
        raise UsageError(msg, hint=Hint(option="allow_insecure_http"))
    return parsed.copy_with(path=parsed.path.rstrip("/") + "/", query=None, fragment=None)


def _hint(data: object) -> Hint | None:
    """The remedy of a service's error answer, by the engine's names (its words dropped);
    None when it gave none or one this client does not know."""
    if not isinstance(data, dict):
        return None
    try:
        return Hint.model_validate({k: data[k] for k in ("option", "action") if k in data})
    except ValueError:
        return None


@dataclass(frozen=True)
class _Answer:
    """An answer of the service, its body read whole (within its bound)."""

    status: int
    content_type: str
    body: bytes


TooLarge = Callable[[int], PatchboxError]
"""The error for an answer over its bound (given the bound)."""


_JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
"""A job id as a URL path segment: no slash, no dot segment, no query or fragment."""


class ServiceClient:
    """A client of one service as one tenant (its bearer ``token``)."""

    def __init__(
        self,
        url: str,
        token: str,
        *,
        timeout: float = READ_SECONDS,
        transport: httpx.BaseTransport | None = None,
        allow_insecure_http: bool = False,
    ) -> None:
        self.url = str(_base_url(url, allow_insecure_http=allow_insecure_http))
        self._secret = _token(token)
        self._http = httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {self._secret}", "Accept-Encoding": "identity"},
            timeout=httpx.Timeout(timeout, connect=CONNECT_SECONDS),
            transport=transport,
            follow_redirects=False,
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # -- plumbing -------------------------------------------------------------------------

    def _scrub(self, text: str) -> str:
        return text.replace(self._secret, "[redacted]")

    def _too_large(self, doing: str) -> TooLarge:
        def error(limit: int) -> PatchboxError:
            msg = f"{doing}: the service's answer is over {limit} bytes; the rest was not read"
            return ServiceError(msg)

        return error

    def _read(self, response: httpx.Response, limit: int, too_large: TooLarge) -> Iterator[bytes]:
        """The body of ``response`` as it arrives (not decoded), raising ``too_large``
        before more than ``limit`` bytes are taken: a declared length over it is refused
        before any byte is read."""
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in {"", "identity"}:
            msg = f"the service's answer is compressed ({encoding[:40]}), which was not asked for"
            raise ServiceError(msg, status=response.status_code)
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise too_large(limit)
        total = 0
        for chunk in response.iter_raw():
            total += len(chunk)
            if total > limit:
                raise too_large(limit)
            yield chunk

    def _request(
        self,
        method: str,
        path: str,
        doing: str,
        *,
        limit: int = MAX_ANSWER_BYTES,
        too_large: TooLarge | None = None,
        **kwargs: Any,
    ) -> _Answer:
        """One request; its answer read up to ``limit`` bytes (``too_large`` past that,
        by default ``SERVICE_BAD_RESPONSE``); an error answer raised as the service's."""
        try:
            with self._http.stream(method, path.lstrip("/"), **kwargs) as response:
                if response.status_code >= 400:
                    raise self._error(response, doing)
                body = b"".join(self._read(response, limit, too_large or self._too_large(doing)))
                kind = response.headers.get("content-type", "")
                return _Answer(response.status_code, kind, body)
        except httpx.HTTPError as exc:
            raise map_service_error(exc, f"{doing} at {self.url}", scrub=self._scrub) from exc

    def _error(self, response: httpx.Response, doing: str) -> ServiceError:
        kind = response.headers.get("content-type", "no content type")[:60]
        status = response.status_code

        def not_ours(limit: int) -> PatchboxError:
            del limit
            msg = (
                f"{doing}: the service answered {status} with something that is not its "
                f"error shape ({kind}); is {self.url} a patchbox service?"
            )
            return ServiceError(msg, status=status)

        try:
            raw = b"".join(self._read(response, MAX_ERROR_BYTES, not_ours))
        except ServiceError as exc:
            return exc
        try:
            error = json.loads(raw)["error"]
            code, message = str(error["code"]), str(error["message"])
        except (ValueError, KeyError, TypeError):
            return ServiceError(not_ours(0).message, status=status)
        return service_error(status, code, self._scrub(message), _hint(error.get("hint")))

    def _json(self, answer: _Answer, doing: str) -> Any:
        try:
            return json.loads(answer.body)
        except ValueError:
            msg = f"{doing}: the service's answer is not JSON; is {self.url} a patchbox service?"
            raise ServiceError(msg, status=answer.status) from None

    def _object(self, method: str, path: str, doing: str, **kwargs: Any) -> dict[str, Any]:
        data = self._json(self._request(method, path, doing, **kwargs), doing)
        if not isinstance(data, dict):
            msg = f"{doing}: the service's answer is not a JSON object"
            raise ServiceError(msg)
        return data

    @staticmethod
    def _job_path(job_id: str, tail: str = "") -> str:
        if not _JOB_ID.fullmatch(job_id):  # a path segment of its own, nothing else
            raise UsageError(f"not a job id: {job_id[:64]!r}")
        return f"v1/jobs/{job_id}{tail}"

    # -- the API --------------------------------------------------------------------------

    def health(self) -> Health:
        """``GET /healthz`` (no authentication needed)."""
        return cast("Health", self._object("GET", "healthz", "checking the service"))

    def submit(
        self,
        task: Mapping[str, Any],
        *,
        repo: str | Path | None = None,
        bundle: str | None = None,
        calls: Mapping[str, Any] | None = None,
        include_local_changes: bool = False,
    ) -> Accepted:
        """Queues a job on ``repo`` (an absolute path on the service's host) or on an
        uploaded ``bundle`` (:meth:`upload_bundle`); ``{"job_id", "status"}``."""
        if (repo is None) == (bundle is None):
            raise UsageError("a job needs a repository path or a bundle id, not both")
        body: SubmitBody = {"task": dict(task)}
        if repo is not None:
            body["repo"] = str(repo)
        if bundle is not None:
            body["bundle"] = bundle
        if calls is not None:
            body["calls"] = dict(calls)
        if include_local_changes:
            body["include_local_changes"] = True
        return cast("Accepted", self._object("POST", "v1/jobs", "submitting the job", json=body))

    def upload_bundle(self, bundle: bytes | Path | IO[bytes]) -> Uploaded:
        """Uploads a git bundle (bytes, a file's path or an open binary file):
        ``{"bundle_id", "head", "size"}``. ``BUNDLE_TOO_LARGE`` over the service's
        ``bundle_max_bytes``, ``BUNDLE_TREE_TOO_LARGE`` when its HEAD checks out more than
        the service's tree limits, ``BUNDLE_INVALID`` when it is not a complete bundle with
        a HEAD."""
        headers = {"Content-Type": "application/octet-stream"}
        timeout = httpx.Timeout(UPLOAD_SECONDS, connect=CONNECT_SECONDS)
        doing = "uploading the bundle"
        if isinstance(bundle, Path):
            with bundle.open("rb") as handle:
                data = self._object(
                    "POST", "v1/bundles", doing, content=handle, headers=headers, timeout=timeout
                )
        else:
            data = self._object(
                "POST", "v1/bundles", doing, content=bundle, headers=headers, timeout=timeout
            )
        return cast("Uploaded", data)

    def jobs(self) -> list[JobRow]:
        """The tenant's jobs, oldest first: ``[{"job_id", "status", "repo", "created"}]``
        (``repo`` is ``bundle:ID`` for a bundle job, which also has ``bundle``)."""
        data = self._object("GET", "v1/jobs", "listing the jobs")
        jobs = data.get("jobs")
        if not isinstance(jobs, list):
            raise ServiceError("listing the jobs: the answer has no list of jobs")
        return cast("list[JobRow]", jobs)

    def job(self, job_id: str) -> RemoteJob:
        """The job as ``patchbox run --json`` prints it (plus ``bundle`` for a bundle job)."""
        return self._view("GET", self._job_path(job_id), f"reading job {job_id}")

    def diff(
        self,
        job_id: str,
        *,
        max_bytes: int = MAX_ANSWER_BYTES,
        too_large: TooLarge | None = None,
    ) -> str:
        """The job's unified diff (empty before it is collected), UTF-8 (a byte that is not
        stays a surrogate escape). Over ``max_bytes`` the download stops there and
        ``too_large(max_bytes)`` is raised (by default ``SERVICE_BAD_RESPONSE``)."""
        answer = self._request(
            "GET",
            self._job_path(job_id, "/diff"),
            f"reading {job_id}'s diff",
            limit=max_bytes,
            too_large=too_large,
        )
        return answer.body.decode("utf-8", "surrogateescape")

    def evidence(self, job_id: str) -> dict[str, Any]:
        """The job's evidence bundle; ``JOB_NOT_FINISHED`` before the job wrote it."""
        return self._object("GET", self._job_path(job_id, "/evidence"), "reading the evidence")

    def attestations(self, job_id: str) -> bytes:
        """The job's signed attestations (JSON Lines); ``JOB_NOT_FINISHED`` before it was
        decided with a diff."""
        path = self._job_path(job_id, "/attestations")
        return self._request("GET", path, f"reading {job_id}'s attestations").body

    def provenance_key(self) -> str:
        """The PEM public key the service signs attestations with."""
        return self._request("GET", "v1/provenance/key", "reading the signing key").body.decode()

    def cancel(self, job_id: str) -> RemoteJob:
        return self._view("POST", self._job_path(job_id, "/cancel"), f"cancelling {job_id}")

    def apply(self, job_id: str) -> RemoteJob:
        """Applies the job in the service's work tree (``NO_WORK_TREE`` for a bundle job)."""
        return self._view("POST", self._job_path(job_id, "/apply"), f"applying {job_id}")

    def revert(self, job_id: str) -> RemoteJob:
        return self._view("POST", self._job_path(job_id, "/revert"), f"reverting {job_id}")

    def discard(self, job_id: str) -> RemoteJob:
        return self._view("POST", self._job_path(job_id, "/discard"), f"discarding {job_id}")

    def rebase(self, job_id: str) -> RemoteJob:
        """Queues a new job that carries this one's diff onto its repository as it is now:
        ``{"job_id", "status", "parent"}``."""
        return self._view("POST", self._job_path(job_id, "/rebase"), f"rebasing {job_id}")

    def _view(self, method: str, path: str, doing: str) -> RemoteJob:
        return cast("RemoteJob", self._object(method, path, doing))

    def status(self, job_id: str) -> str:
        """The job's state as the service's queue sees it (``GET /v1/jobs``): final only once
        the worker is done with the job."""
        for job in self.jobs():
            if job.get("job_id") == job_id:
                return str(job.get("status"))
        raise service_error(404, str(ErrorCode.NOT_FOUND), f"no job {job_id[:64]!r}")

    def events(
        self, job_id: str, *, last_event_id: int = 0, retries: int = EVENT_RETRIES
    ) -> Iterator[Event]:
        """The job's events after ``last_event_id``, as they come, until the job is neither
        queued nor running. A dropped connection (or a stream that ends while the job still
        runs) is resumed with ``Last-Event-ID``: no event is lost or repeated; after
        ``retries`` attempts in a row without a new event, ``SERVICE_UNREACHABLE``."""
        path = self._job_path(job_id, "/events")
        last, failures, delay = last_event_id, 0, 0.5
        final = False
        opened: list[bool] = []
        while True:
            before = last
            try:
                for event in self._stream(path, last, opened):
                    last = event.id
                    if event.type == "state":
                        final = event.data.get("state") not in PENDING
                    yield event
            except httpx.HTTPError as exc:
                failures = 0 if last > before else failures + 1
                if failures > retries or not opened:  # never answered: say so at once
                    doing = f"streaming the events of {job_id} from {self.url}"
                    raise map_service_error(exc, doing, scrub=self._scrub) from exc
                time.sleep(min(delay * 2 ** max(failures - 1, 0), 5.0))
                continue
            if final or self.status(job_id) not in PENDING:
                return
            failures = 0 if last > before else failures + 1
            if failures > retries:
                msg = f"the event stream of {job_id} keeps ending while the job runs"
                raise ServiceUnreachableError(msg)
            time.sleep(min(delay * 2 ** max(failures - 1, 0), 5.0))

    def _stream(self, path: str, last: int, opened: list[bool]) -> Iterator[Event]:
        headers = {"Last-Event-ID": str(last)} if last else {}
        with self._http.stream("GET", path, headers=headers) as response:
            if response.status_code >= 400:
                raise self._error(response, "streaming the events")
            opened.append(True)
            fields: dict[str, str] = {}
            for line in self._lines(response):
                if line:
                    if not line.startswith(":"):
                        name, _, value = line.partition(":")
                        fields[name] = value.removeprefix(" ")
                    continue
                if "id" in fields and "event" in fields:
                    yield _event(fields)
                fields = {}

    def _lines(self, response: httpx.Response) -> Iterator[str]:
        """The lines of an event stream, each at most :data:`MAX_EVENT_BYTES`."""

        def too_long(limit: int) -> PatchboxError:
            return ServiceError(f"the event stream holds a line over {limit} bytes")

        pending = b""
        for chunk in self._read(response, 1 << 62, too_long):
            pending += chunk
            *lines, pending = pending.split(b"\n")
            if len(pending) > MAX_EVENT_BYTES:
                raise too_long(MAX_EVENT_BYTES)
            for line in lines:
                if len(line) > MAX_EVENT_BYTES:
                    raise too_long(MAX_EVENT_BYTES)
                yield line.removesuffix(b"\r").decode("utf-8", "replace")
        if pending:
            yield pending.removesuffix(b"\r").decode("utf-8", "replace")

    def wait(self, job_id: str) -> RemoteJob:
        """Follows the job's events until it ends; then the job (:meth:`job`)."""
        for _event in self.events(job_id):
            pass
        return self.job(job_id)


def _event(fields: dict[str, str]) -> Event:
    try:
        data = json.loads(fields.get("data", "{}"))
        return Event(int(fields["id"]), fields["event"], data if isinstance(data, dict) else {})
    except ValueError as exc:
        raise ServiceError("the event stream holds an event that is not the service's") from exc
