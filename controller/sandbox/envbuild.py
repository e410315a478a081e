"""An environment's image, built once: the recipe of :mod:`controller.sandbox.environment`
sent to the daemon's builder under the build lock, its output followed step by step (the
running step, its time, the log's tail), a timer that names the running step and its time
every :data:`PROGRESS_SECONDS` while it runs (with or without output), a watchdog that
kills the running step when the setup's time is up or the job is cancelled, and a failure
report that names the step.

The setup steps' network is the environment's egress: with none they run with no network
at all; with some, on an internal network whose one way out is an egress proxy of their own
(:mod:`controller.sandbox.egress`) that allows exactly those pairs, and the requests it saw
are returned with the image (and named in a failure when it refused any)."""

from __future__ import annotations

import contextlib
import io
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any, TypedDict

import docker
import docker.errors

from controller.config.environment import EnvironmentSpec
from controller.config.network import EgressRule
from controller.errors import EnvironmentBuildError, ErrorCode, PatchboxError
from controller.paths import sandbox_image_dir
from controller.repo.baseline import Baseline
from controller.sandbox import agentlayer
from controller.sandbox.buildwatch import Ticker, Watchdog
from controller.sandbox.egress import (
    Connection,
    EgressProxy,
    start_proxy,
)
from controller.sandbox.environment import (
    ENV_REPO,
    HAS_PYTHON,
    LABEL_BASE,
    LABEL_KEY,
    LABEL_SPEC,
    NO_PYTHON_EXIT,
    STAGED_MTIME,
    InputFile,
    agent_layer,
    build_context,
    dockerfile,
    environment_key,
    find_ca_bundle,
    label_spec,
    read_blobs,
    seed_of,
    select_inputs,
    step_names,
)
from controller.sandbox.image import ImageBuilder, Progress, build_lock, context_digest
from controller.sandbox.labels import KIND, OWNER, OWNER_VALUE, current_identity
from controller.sandbox.proxyimage import default_proxy_image

PROGRESS_SECONDS = 10.0
"""How often a running build step is named with its elapsed time."""


class StepTime(TypedDict):
    """A build step and the seconds it took."""

    name: str
    seconds: float


@dataclass(frozen=True)
class EnvironmentImage:
    tag: str
    image_id: str
    key: str
    base: str
    built: bool
    """False when the image was already there."""
    seconds: float
    steps: list[StepTime] = field(default_factory=list)
    """Per build step: its name and seconds (empty when nothing was built)."""
    network: list[Connection] = field(default_factory=list)
    """The requests the setup's proxy saw (empty when nothing was built or no egress)."""


@dataclass(frozen=True)
class SetupEgress:
    """What an environment's setup steps may reach, and the proxy's name and labels (the
    reaper's, as a job's)."""

    rules: tuple[EgressRule, ...]
    name: str
    labels: dict[str, str]
    outside: str = "bridge"


@dataclass
class _Step:
    index: int
    name: str


class EnvironmentBuilder:
    """Makes (once) and finds environment images."""

    def __init__(
        self,
        client: docker.DockerClient,
        progress: Progress | None = None,
        ca_bundle: str | None = None,
        egress: SetupEgress | None = None,
    ) -> None:
        self._client = client
        self._progress = progress or (lambda _msg: None)
        self._ca_setting = ca_bundle
        self._egress = egress if egress is not None and egress.rules else None

    def _base(self, spec: EnvironmentSpec) -> tuple[str, str]:
        """(base reference, its image id): a named base present or pulled, else the default
        sandbox base (made locally where nothing can be pulled)."""
        if spec.base is None:
            images = ImageBuilder(self._client, self._progress)
            ref, _source = images.resolve_base(None)
            return ref, self._client.images.get(ref).id or ""
        try:
            return spec.base, self._client.images.get(spec.base).id or ""
        except docker.errors.ImageNotFound:
            pass
        except docker.errors.APIError as exc:
            msg = f"the base image {spec.base!r} cannot be inspected: {exc.explanation}"
            raise EnvironmentBuildError(msg) from exc
        self._progress(f"environment: pulling {spec.base}")
        try:
            image = self._client.images.pull(spec.base)
        except docker.errors.APIError as exc:
            msg = (
                f"the base image {spec.base!r} is not on this Docker host and cannot be pulled: "
                f"{(exc.explanation or str(exc))[:300]}"
            )
            raise EnvironmentBuildError(msg) from exc
        return spec.base, image.id or ""

    def plan(
        self, spec: EnvironmentSpec, baseline: Baseline
    ) -> tuple[str, str, str, list[InputFile]]:
        """(tag, key, base reference, inputs) of the environment, without building."""
        files = select_inputs(baseline, spec.inputs)
        base_ref, base_id = self._base(spec)
        pairs = [] if self._egress is None else [r.text() for r in self._egress.rules]
        key = environment_key(base_id, spec, files, context_digest(sandbox_image_dir()), pairs)
        return f"{ENV_REPO}:{key[:16]}", key, base_ref, files

    def ensure(
        self,
        spec: EnvironmentSpec,
        baseline: Baseline,
        *,
        cancel: threading.Event | None = None,
    ) -> EnvironmentImage:
        """The environment's image, built if it is missing."""
        started = time.monotonic()
        tag, key, base_ref, files = self.plan(spec, baseline)
        existing = _image_id(self._client, tag)
        if existing is None:
            # the proxy's image first: its own build takes the build lock
            proxy_tag = (
                None if self._egress is None else default_proxy_image(self._client, self._progress)
            )
            with build_lock():  # jobs at once build a missing environment once
                existing = _image_id(self._client, tag)
                if existing is None:
                    return self._build(
                        spec, baseline, (tag, key, base_ref), files, cancel, started, proxy_tag
                    )
        return EnvironmentImage(
            tag, existing, key, base_ref, built=False, seconds=time.monotonic() - started
        )

    def _build(  # noqa: PLR0913, PLR0917 - internal; the plan's parts
        self,
        spec: EnvironmentSpec,
        baseline: Baseline,
        names: tuple[str, str, str],
        files: list[InputFile],
        cancel: threading.Event | None,
        started: float,
        proxy_tag: str | None,
    ) -> EnvironmentImage:
        tag, key, base_ref = names
        ca = find_ca_bundle(self._ca_setting)
        labels = {
            OWNER: OWNER_VALUE,
            KIND: "environment",
            LABEL_KEY: key,
            LABEL_BASE: base_ref,
            LABEL_SPEC: json.dumps(label_spec(spec), sort_keys=True),
        }
        user = (self._client.images.get(base_ref).attrs.get("Config") or {}).get("User") or ""
        as_root = user.split(":", 1)[0] in {"", "root", "0"}
        python = self._needs_python(base_ref)
        text = dockerfile(base_ref, spec, labels, ca=ca is not None, as_root=as_root, python=python)
        context = build_context(text, list(read_blobs(baseline, files)), ca)
        steps = step_names(spec, as_root=as_root, python=python)
        self._progress(f"environment: building {tag} from {base_ref} ({len(files)} input files)")
        watchdog = Watchdog(self._client, key, spec.setup_timeout_seconds, cancel)
        run = _BuildRun(steps, self._progress)
        memory = spec.setup_memory_mb * 1024 * 1024
        proxy = self._proxy(proxy_tag)
        try:
            with watchdog, Ticker(run.tick):
                try:
                    stream = self._client.api.build(
                        fileobj=io.BytesIO(context),
                        custom_context=True,
                        rm=True,
                        forcerm=True,
                        pull=False,
                        decode=True,
                        container_limits={"memory": memory, "memswap": memory},
                        network_mode="none" if proxy is None else proxy.network,
                        buildargs=None if proxy is None else proxy.environment(),
                    )
                    for chunk in stream:
                        run.feed(chunk)
                    if run.error is None and not watchdog.fired:
                        self._finish(run, tag, memory, seed_of(spec))
                except docker.errors.APIError as exc:
                    run.error = run.error or (exc.explanation or str(exc))
                except (OSError, ValueError) as exc:  # the connection, closed by a cancel
                    run.error = run.error or str(exc)
            run.finish()
            _remove_image(self._client, run.staged)
            if watchdog.fired or run.error is not None:
                watchdog.remove_steps()  # the builder removes them too; nothing may be left
            requests = _requests(proxy)
        finally:
            if proxy is not None:
                proxy.close()
        run.refused = refused_words(requests)
        if watchdog.fired:
            reason = (
                "cancelled"
                if watchdog.cancelled
                else (f"the setup did not finish within {spec.setup_timeout_seconds:g} s")
            )
            raise run.failure(reason, code=ErrorCode.CANCELLED if watchdog.cancelled else None)
        if run.error is not None:
            raise run.failure(None)
        image_id = _image_id(self._client, tag)
        if image_id is None:
            msg = "the environment build ended without an image"
            raise EnvironmentBuildError(msg)
        seconds = time.monotonic() - started
        self._progress(f"environment: built {tag} in {seconds:.1f} s")
        return EnvironmentImage(
            tag,
            image_id,
            key,
            base_ref,
            built=True,
            seconds=seconds,
            steps=run.steps,
            network=requests,
        )

    def _needs_python(self, base_ref: str) -> bool:
        """Whether the base lacks python3 >= 3.9 or git (a step then installs them), from
        one container of the base with no network; any doubt keeps the step. Known per
        base image id for the process's life."""
        try:
            base_id = str(self._client.images.get(base_ref).id)
        except docker.errors.DockerException:
            return True
        if base_id not in _HAS_PYTHON:
            _HAS_PYTHON[base_id] = _probe(self._client, base_id)
        return not _HAS_PYTHON[base_id]

    def _finish(self, run: _BuildRun, tag: str, memory: int, seed: str | None) -> None:
        """The agent layer on the built steps, in one container and one commit (the seed
        first in the same container)."""
        if run.staged is None:
            run.error = "the builder named no image"
            return
        run.begin("agent layer")
        repository, _, name = tag.partition(":")
        image, code, log = agentlayer.finish(
            self._client,
            run.staged,
            repository=repository,
            tag=name,
            layer_text=agent_layer(),
            mtime=STAGED_MTIME,
            memory=memory,
            prelude=seed,
        )
        if image is None:
            run.tail = [line for line in log.splitlines() if line.strip()][-80:]
            run.exit_code = code
            run.error = "the step failed"

    def _proxy(self, image: str | None) -> EgressProxy | None:
        """The setup's proxy, allowing the environment's egress; None without egress."""
        if self._egress is None or image is None:
            return None
        egress = self._egress
        pairs = ", ".join(r.text() for r in egress.rules)
        self._progress(f"environment: starting the egress proxy for the setup ({pairs})")
        return start_proxy(
            self._client,
            self._progress,
            name=egress.name,
            labels=egress.labels,
            outside=egress.outside,
            rules=egress.rules,
            image=image,
        )


def _requests(proxy: EgressProxy | None) -> list[Connection]:
    """What the proxy saw (empty without one or when its log cannot be read)."""
    if proxy is None:
        return []
    with contextlib.suppress(PatchboxError):
        return proxy.connections()
    return []


def refused_words(requests: list[Connection]) -> str:
    """The pairs the setup's proxy refused, in words; empty when it refused none."""
    words = {
        "not_allowed": "not in the environment's egress",
        "inward": "resolves to a private or local address",
        "unresolved": "does not resolve",
    }
    refused: dict[str, str] = {}
    for c in requests:
        if not c.allowed:
            refused.setdefault(f"{c.host}:{c.port}", words.get(c.reason, "refused"))
    return ", ".join(f"{pair} ({why})" for pair, why in refused.items())


class _BuildRun:
    """Follows the builder's output: the running step, its elapsed time, the log's tail."""

    def __init__(self, names: dict[int, str], progress: Progress) -> None:
        self._names = names
        self._progress = progress
        self.step: _Step | None = None
        self.step_started = time.monotonic()
        self.tail: list[str] = []
        self.error: str | None = None
        self.exit_code: int | None = None
        self.steps: list[StepTime] = []
        self.staged: str | None = None
        """The image the builder made (the steps before the agent layer)."""
        self.refused = ""
        """The pairs the setup's proxy refused, in words (:func:`refused_words`)."""
        self._last_note = time.monotonic()
        self._lock = threading.Lock()

    def feed(self, chunk: dict[str, Any]) -> None:
        aux = chunk.get("aux")
        if isinstance(aux, dict) and isinstance(aux.get("ID"), str):
            self.staged = str(aux["ID"])
        if "error" in chunk or "errorDetail" in chunk:
            detail = chunk.get("errorDetail") or {}
            self.error = str(detail.get("message") or chunk.get("error") or "build failed")
            code = detail.get("code")
            self.exit_code = code if isinstance(code, int) else None
            return
        text = chunk.get("stream")
        if not isinstance(text, str):
            return
        for line in text.splitlines():
            if line.startswith("Step ") and " : " in line:
                number = line[5:].split("/", 1)[0]
                if number.isdigit():
                    self._start(int(number))
                    continue
            if line.strip():
                self.tail = [*self.tail[-79:], line.rstrip()]

    def tick(self) -> None:
        """Names the running step with its elapsed time, every :data:`PROGRESS_SECONDS`
        of it (called by :class:`_Ticker`, whatever the step writes)."""
        with self._lock:
            step, now = self.step, time.monotonic()
            if step is None or now - self._last_note < PROGRESS_SECONDS:
                return
            self._last_note += PROGRESS_SECONDS * ((now - self._last_note) // PROGRESS_SECONDS)
            elapsed = now - self.step_started
        self._progress(f"environment: {step.name} ({elapsed:.0f} s)")

    def begin(self, name: str) -> None:
        """A step after the builder's (the agent layer)."""
        self._start(len(self._names) + 1, name)

    def _start(self, number: int, name: str | None = None) -> None:
        self._close_step()
        name = name or self._names.get(number, "agent layer")
        with self._lock:
            self.step = _Step(number, name)
            self.step_started = time.monotonic()
            self._last_note = self.step_started
        self.tail = []
        first_agent_step = name == "agent layer" and all(
            s["name"] != "agent layer" for s in self.steps
        )
        if name.startswith(("setup", "python3")) or first_agent_step:
            self._progress(f"environment: {name}")

    def _close_step(self) -> None:
        if self.step is None:
            return
        seconds = round(time.monotonic() - self.step_started, 3)
        if self.steps and self.steps[-1]["name"] == self.step.name:
            self.steps[-1]["seconds"] = round(self.steps[-1]["seconds"] + seconds, 3)
        else:
            self.steps.append({"name": self.step.name, "seconds": seconds})

    def finish(self) -> None:
        self._close_step()

    def failure(self, reason: str | None, code: ErrorCode | None = None) -> PatchboxError:
        step = self.step.name if self.step is not None else "before the first step"
        exit_text = ""
        if self.exit_code is not None:
            exit_text = f", exit code {self.exit_code}"
        elif self.error and "non-zero code:" in self.error:
            exit_text = ", exit code " + self.error.rsplit("non-zero code:", 1)[1].strip()
        what = reason or (self.error or "build failed")
        if reason is None and self.error and "returned a non-zero code" in self.error:
            what = "the step failed"  # the builder's text repeats the whole command
        if self.exit_code == NO_PYTHON_EXIT or any("patchbox: " in t for t in self.tail[-5:]):
            told = [t for t in self.tail if t.startswith("patchbox: ")]
            if told:
                what = told[-1].removeprefix("patchbox: ")
        tail = "\n".join(self.tail[-20:])
        msg = f"environment build failed at {step}{exit_text}: {what[:500]}"
        if self.refused:
            msg += f"\nthe egress proxy refused: {self.refused[:1000]}"
        if tail:
            msg += "\nlast lines of its log:\n" + tail[-4000:]
        return EnvironmentBuildError(msg, code=code)


def _remove_image(client: docker.DockerClient, image: str | None) -> None:
    """The builder's image, untagged: gone unless the finished image stands on it."""
    if image is not None:
        with contextlib.suppress(docker.errors.APIError):
            client.images.remove(image, noprune=False)


def _image_id(client: docker.DockerClient, ref: str) -> str | None:
    try:
        return client.images.get(ref).id
    except docker.errors.ImageNotFound:
        return None


_HAS_PYTHON: dict[str, bool] = {}
"""Base image id -> whether it has python3 >= 3.9 and git (:data:`HAS_PYTHON`)."""


def _probe(client: docker.DockerClient, image_id: str) -> bool:
    """Runs :data:`HAS_PYTHON` in a container of ``image_id`` (no network, 64 MB, root)."""
    try:
        made = client.api.create_container(
            image_id,
            entrypoint=["/bin/sh", "-c"],
            command=[HAS_PYTHON],
            user="0:0",
            network_disabled=True,
            labels=current_identity().labels(image_id[7:19], "environment-probe"),
            host_config=client.api.create_host_config(mem_limit=64 * 1024 * 1024),
        )
    except docker.errors.DockerException:
        return False
    cid = str(made["Id"])
    try:
        client.api.start(cid)
        return int(client.api.wait(cid, timeout=60)["StatusCode"]) == 0
    except Exception:
        return False
    finally:
        with contextlib.suppress(docker.errors.APIError):
            client.api.remove_container(cid, force=True)
