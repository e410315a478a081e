"""The command's entry point ends the process with ``main``'s code: every byte of output, the
threads still running and the ``atexit`` handlers are kept, and a reader gone before the
last flush is quiet."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PROGRAM = textwrap.dedent(
    """
    import atexit, sys, threading, time
    from concurrent.futures import ThreadPoolExecutor
    from pathlib import Path
    import controller.cli.main as cli

    out = Path(sys.argv[1])

    def late_writer() -> None:
        time.sleep(0.3)
        (out / "thread").write_text("done")

    def fake_main(argv=None, doors=None) -> int:
        atexit.register(lambda: (out / "atexit").write_text("ran"))
        threading.Thread(target=late_writer).start()
        # a pool whose idle workers (not daemons) wait for work until told to stop at exit
        pool = ThreadPoolExecutor(max_workers=4)
        list(pool.map(abs, range(8)))
        sys.stdout.write("x" * int(sys.argv[2]))  # partly buffered: flushed on the way out
        sys.stderr.write("to stderr")
        return 3

    cli.main = fake_main
    cli.run()
    (out / "after").write_text("run() returned")
    """
)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONUNBUFFERED", None)  # standard output block-buffered, as in a pipe
    return env


@pytest.mark.parametrize("size", [100, 5000, 1 << 20])
def test_exit_code_output_threads_and_atexit_are_kept(tmp_path: Path, size: int) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", PROGRAM, str(tmp_path), str(size)],
        capture_output=True,
        check=False,
        env=_env(),
        timeout=60,
    )
    assert proc.returncode == 3
    assert proc.stdout == b"x" * size
    assert proc.stderr == b"to stderr"
    assert (tmp_path / "thread").read_text() == "done"
    assert (tmp_path / "atexit").read_text() == "ran"
    assert not (tmp_path / "after").exists()


def test_a_closed_stdout_ends_quietly(tmp_path: Path) -> None:
    """A reader gone before the last flush (``| head``): the code stands, no traceback."""
    proc = subprocess.Popen(
        [sys.executable, "-c", PROGRAM, str(tmp_path), "100"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_env(),
    )
    assert proc.stdout is not None
    assert proc.stderr is not None
    proc.stdout.close()  # before the thread's 0.3 s are over, so before the flush
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == 3
    assert err == b"to stderr"


def test_the_module_entry_uses_it(tmp_path: Path) -> None:
    env = dict(os.environ, PATCHBOX_HOME=str(tmp_path / "home"))
    proc = subprocess.run(
        [sys.executable, "-m", "controller", "jobs", "--json"],
        capture_output=True,
        check=False,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"jobs": []}
