"""A sandbox fed its baseline through a FIFO (runc): ``git archive`` writes into a named pipe
mounted read-only into the container while the container unpacks it, or a cached archive is
spliced into it. The container may be started before the baseline is known; it holds
nothing of the repository until the pipe is fed."""

from __future__ import annotations

import errno
import os
import shutil
import threading
import time
from pathlib import Path

import docker

from controller.errors import SandboxError
from controller.paths import MOUNT_PREFIX, mount_staging_root, owned_temp_dir
from controller.repo.baseline import Baseline, archive_into, grow_pipe
from controller.sandbox.base import SandboxSpec
from controller.sandbox.docker import DockerSandbox
from controller.sandbox.labels import ControllerIdentity

FIFO_OPEN_SECONDS = 60.0
SPLICE_CHUNK = 1 << 20

FeedSource = Baseline | Path | None
"""What a FIFO is fed: a baseline (``git archive``), a cached archive, or nothing."""


class _FifoFeeder(threading.Thread):
    """Feeds the container's FIFO once :meth:`decide` says with what: ``git archive``
    writes into it directly (no byte through Python, and no second copy on the critical
    path: the cache is filled once the sandbox is ready), or a cached archive is spliced
    into it. A reader that stops early ends the feed, not the job: GNU tar stops at the
    end-of-archive blocks, and whether the container unpacked the tree is its own report's
    to say."""

    def __init__(self, fifo: Path) -> None:
        super().__init__(daemon=True, name="baseline-fifo")
        self.fifo = fifo
        self.error: BaseException | None = None
        self.stop = threading.Event()
        self._decided = threading.Event()
        self._source: FeedSource = None

    def decide(self, source: FeedSource) -> None:
        self._source = source
        self._decided.set()

    def _open(self) -> int:
        deadline = time.monotonic() + FIFO_OPEN_SECONDS
        while not self.stop.is_set():
            try:
                fd = os.open(self.fifo, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            except OSError as exc:
                if exc.errno != errno.ENXIO or time.monotonic() > deadline:
                    raise
                time.sleep(0.005)
                continue
            os.set_blocking(fd, True)
            grow_pipe(fd)
            return fd
        msg = "stopped before the sandbox opened the baseline"
        raise SandboxError(msg)

    def run(self) -> None:
        fd = -1
        try:
            fd = self._open()
            self._decided.wait()
            source = self._source
            if isinstance(source, Path):
                src = os.open(source, os.O_RDONLY | os.O_CLOEXEC)
                try:
                    _relay(src, fd)
                finally:
                    os.close(src)
            elif source is not None:
                archive_into(source, fd)
        except BaseException as exc:
            self.error = exc
        finally:
            if fd >= 0:
                os.close(fd)


def _relay(src: int, fd: int) -> None:
    """Copies the file ``src`` into the pipe ``fd`` (spliced: no copy through Python); ends
    quietly when the pipe's reader has gone."""
    splice = getattr(os, "splice", None)
    try:
        while True:
            if splice is not None:
                n = splice(src, fd, SPLICE_CHUNK)
            else:
                data = os.read(src, SPLICE_CHUNK)
                n = len(data)
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
            if n == 0:
                return
    except BrokenPipeError:
        return


class FifoStart:
    """A sandbox whose baseline comes through a FIFO: started now (in a thread, since the
    start ends with the greeting, after the unpacking), fed when :meth:`feed` names the
    source. Started before the baseline is known, it holds nothing of the repository until
    then; :meth:`discard` removes it."""

    def __init__(
        self, client: docker.DockerClient, spec: SandboxSpec, identity: ControllerIdentity
    ) -> None:
        self.folder = owned_temp_dir(MOUNT_PREFIX, mount_staging_root())
        fifo = self.folder / "baseline.tar"
        os.mkfifo(fifo, 0o644)
        self.feeder = _FifoFeeder(fifo)
        self.box: DockerSandbox | None = None
        self.error: BaseException | None = None
        job = spec.model_copy(update={"preload": str(fifo)})
        self.thread = threading.Thread(
            target=self._start, args=(client, job, identity), name="sandbox-start"
        )
        self.feeder.start()
        self.thread.start()

    def _start(
        self, client: docker.DockerClient, spec: SandboxSpec, identity: ControllerIdentity
    ) -> None:
        try:
            self.box = DockerSandbox.start(client, spec, identity)
        except BaseException as exc:
            self.error = exc
        finally:
            self.feeder.stop.set()  # a feeder still waiting for a reader never gets one

    def _settle(self, source: FeedSource) -> DockerSandbox | None:
        self.feeder.decide(source)
        try:
            self.thread.join()
            self.feeder.join()
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)
        return self.box

    def feed(self, source: Baseline | Path) -> DockerSandbox:
        """Feeds the FIFO from ``source``; the greeted sandbox holding it."""
        box = self._settle(source)
        if self.error is not None:
            if box is not None:
                box.close()
            raise self.error
        assert box is not None  # noqa: S101 - set whenever the start did not fail
        if self.feeder.error is not None:
            box.close()
            error = self.feeder.error
            raise SandboxError(f"the baseline archive failed: {error}") from error
        return box

    def discard(self) -> None:
        """Ends the FIFO empty and removes the sandbox (nothing of the repository in it)."""
        box = self._settle(None)
        if box is not None:
            box.close()
