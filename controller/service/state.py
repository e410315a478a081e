"""The service's state as its handlers see it (:class:`Service`): configuration, store,
runner and metrics; who a request's bearer token is (its tenant), what the tenant owns, and
a job's view as the tenant sees it. A refusal is a :class:`controller.errors.ServiceError`
with its HTTP status (:func:`refused`)."""

from __future__ import annotations

import hashlib
import hmac
import os
import threading
from typing import TYPE_CHECKING

from controller.api.views import BundleRef, JobView, job_diff, job_view
from controller.errorinfo import ErrorInfo
from controller.errors import ErrorCode, PatchboxError, ServiceError
from controller.jobs.evidence import relative_to_home
from controller.jobs.settle import settled
from controller.jobs.store import JobStore
from controller.logs import Scrubber
from controller.repo.pin import RepoPin, pin_repo
from controller.service.bundles import BUNDLE_ID, clone_path
from controller.service.metrics import Metrics
from controller.service.policy import pin_of

if TYPE_CHECKING:
    from starlette.requests import Request

    from controller.config.host import HostConfig
    from controller.service.config import ServiceConfig, TenantConfig
    from controller.service.runner import Runner
    from controller.service.store import Bundle, JobRow, ServiceStore


def refused(status: int, code: str, message: str) -> ServiceError:
    """The error answer of a refused request: ``code`` (an :class:`ErrorCode`) with its HTTP
    ``status``; the same error a client of the service raises for it."""
    return ServiceError(message, code=ErrorCode(code), status=status)


class Service:
    """The application's state: configuration, store, runner and metrics."""

    def __init__(
        self, store: ServiceStore, host: HostConfig, service: ServiceConfig, runner: Runner
    ) -> None:
        self.store = store
        self.host = host
        self.config = service
        self.runner = runner
        self.metrics = Metrics()
        self.stopping = threading.Event()

    # -- who and what ---------------------------------------------------------------------

    def tenant_of(self, request: Request) -> TenantConfig:
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise refused(401, "UNAUTHORIZED", "a bearer token is required")
        digest = hashlib.sha256(token.strip().encode("utf-8", "surrogatepass")).hexdigest()
        found = None
        for tenant in self.config.tenants:
            if hmac.compare_digest(digest, tenant.token_sha256):
                found = tenant
        if found is None:
            raise refused(401, "UNAUTHORIZED", "the bearer token is not valid")
        return found

    def metrics_operator(self, request: Request) -> bool:
        """Whether ``request`` has the operator's metrics token (False without a token;
        401 for any other token, a tenant's included)."""
        header = request.headers.get("authorization", "")
        if not header:
            return False
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise refused(401, "UNAUTHORIZED", "the metrics token is sent as a bearer token")
        expected = self.config.metrics_token_sha256
        if expected is None:
            msg = "no metrics token is configured (metrics_token_sha256): ask without a token"
            raise refused(401, "UNAUTHORIZED", msg)
        digest = hashlib.sha256(token.strip().encode("utf-8", "surrogatepass")).hexdigest()
        if not hmac.compare_digest(digest, expected):
            raise refused(401, "UNAUTHORIZED", "the bearer token is not the metrics token")
        return True

    def own_job(self, tenant: TenantConfig, job_id: str) -> JobRow:
        row = self.store.get_job(job_id)
        if row is None or row.tenant != tenant.name:
            raise refused(404, "NOT_FOUND", f"no job {job_id[:64]!r}")
        return row

    def own_bundle(self, tenant: TenantConfig, bundle_id: str) -> Bundle:
        found = self.store.get_bundle(bundle_id) if BUNDLE_ID.match(bundle_id) else None
        if found is None or found.tenant != tenant.name:
            raise refused(404, "NOT_FOUND", f"no bundle {bundle_id[:64]!r}")
        return found

    def allowed_repo(self, tenant: TenantConfig, repo: str) -> RepoPin:
        """The repository, resolved below one of the tenant's roots and pinned, its git data
        checked (:mod:`controller.repo.pin`): ``REPO_NOT_ALLOWED`` (403) otherwise."""
        pin = pin_repo(self.runner.confinements[tenant.name], repo)
        pin.verify()
        return pin

    def pin_of(self, row: JobRow) -> RepoPin | None:
        """A job's pin (None for a bundle job): what apply, revert and discard check."""
        return pin_of(self.runner.confinements[row.tenant], row)

    # -- views ----------------------------------------------------------------------------

    def view(self, row: JobRow) -> JobView:
        """The job's view (the object ``run --json`` prints), settled from the journal
        through the job's pin; before a worker made its record, its state and the error
        it could not start with."""
        store = JobStore()
        bundle = bundle_of(row)
        try:
            record = settled(store, store.load(row.job_id), pin=self.pin_of(row))
        except PatchboxError:
            errors = [
                ErrorInfo(**error)
                for e in self.store.events_after(row.job_id, 0)
                if (error := e.error())
            ]
            return JobView.before_record(
                row.job_id, row.state, errors[-1] if errors else None, bundle
            )
        evidence = store.folder(row.job_id) / "evidence.json"
        where = relative_to_home(evidence) if evidence.is_file() else ""
        view = job_view(record, job_diff(store, row.job_id), where)
        if bundle is not None:  # the clone's path is the service's, not the tenant's
            shown = Scrubber(row.repo).value(view.model_dump(mode="json", exclude={"diff"}))
            view = JobView.model_validate({**shown, "diff": view.diff})
        return view.model_copy(update={"bundle": bundle})

    def clone_of(self, tenant: str, job_id: str) -> str:
        """Where a bundle job's clone will be (its worker checks the bundle out there)."""
        return os.path.realpath(clone_path(self.config, tenant, job_id))

    def hide_paths(self, message: str) -> str:
        """``message`` without the service's own folder (``data_dir``): a tenant never
        learns where the service keeps bundles and clones."""
        data = self.config.data_path()
        for path in sorted({str(data), os.path.realpath(data)}, key=len, reverse=True):
            message = message.replace(path, "<data_dir>")
        return message


def bundle_of(row: JobRow) -> BundleRef | None:
    """The bundle a job ran on (None for a job on a tenant's repository)."""
    bundle = row.request.bundle
    return BundleRef(id=bundle, head=row.request.bundle_head or "") if bundle else None


def repo_of(row: JobRow) -> str:
    """The ``repo`` a tenant sees: its repository's path, or ``bundle:ID`` for a job on an
    uploaded bundle (whose clone is in the service's own folder)."""
    bundle = row.request.bundle
    return f"bundle:{bundle}" if bundle else row.repo
