"""An environment build's timer (naming the running step while it runs) and watchdog
(killing the running step when the setup's time is up or the job is cancelled)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable

import docker
import docker.errors

from controller.sandbox.environment import LABEL_KEY


class Ticker:
    """Calls ``tick`` twice a second while the build runs."""

    def __init__(self, tick: Callable[[], None]) -> None:
        self._run = tick
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._tick, name="env-build-progress", daemon=True)

    def __enter__(self) -> Ticker:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._done.set()
        self._thread.join()

    def _tick(self) -> None:
        while not self._done.wait(0.5):
            self._run()


class Watchdog:
    """Kills the build's running step when the setup's time is up or the job is cancelled
    (the step's container carries the environment's key as a label)."""

    def __init__(
        self,
        client: docker.DockerClient,
        key: str,
        seconds: float,
        cancel: threading.Event | None,
    ) -> None:
        self._client = client
        self._key = key
        self._deadline = time.monotonic() + seconds
        self._cancel = cancel or threading.Event()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="env-build-watchdog", daemon=True)
        self.fired = False
        self.cancelled = False

    def __enter__(self) -> Watchdog:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._done.set()
        self._thread.join()

    def _watch(self) -> None:
        while not self._done.is_set():
            if self._cancel.is_set():
                self.cancelled = True
            elif time.monotonic() < self._deadline:
                self._done.wait(0.2)
                continue
            self.fired = True
            # Until the build returns: a later step must not start after the kill.
            while not self._done.is_set():
                self._kill_steps()
                self._done.wait(0.5)
            return

    def remove_steps(self) -> None:
        with contextlib.suppress(docker.errors.APIError):
            for container in self._client.containers.list(
                all=True, filters={"label": f"{LABEL_KEY}={self._key}"}, sparse=True
            ):
                with contextlib.suppress(docker.errors.APIError):
                    container.remove(force=True)

    def _kill_steps(self) -> None:
        with contextlib.suppress(docker.errors.APIError):
            for container in self._client.containers.list(
                filters={"label": f"{LABEL_KEY}={self._key}"}, sparse=True
            ):
                with contextlib.suppress(docker.errors.APIError):
                    container.kill()
