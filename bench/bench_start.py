"""The CLI's own start: from the interpreter's start to ``main``, measured in fresh
processes, against the bare interpreter in the same rounds.

Each round, in rotating order, one fresh process of each:

- ``python3 -c pass`` (the interpreter alone, wall time: the reference);
- ``python3 -c 'import controller.main'`` and the CLI's module, timed inside the process
  around the imports (what ``patchbox`` does before ``main`` runs: the entry point imports
  ``controller.main``, whose ``run`` turns the collector off, imports structlog without
  the console extras it would otherwise load, then the CLI's module);
- the same with ``rich`` made unimportable first, as in a plain install (``rich`` is here
  only because a development tool, import-linter, requires it, and structlog imports it for
  its console tracebacks when it can);
- ``python3 -m controller --version`` (a whole command that ends at once, wall time).

Target: the imports to ``main`` at most 150 ms (median).

    python3 bench/bench_start.py [--rounds 20]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

from common import loadavg, print_table

IMPORT = (
    "import gc, time; t = time.perf_counter(); import controller.main; gc.disable(); "
    "controller.main.import_logging(); import controller.cli.main; "
    "print((time.perf_counter() - t) * 1000)"
)
WITHOUT_RICH = "import sys; sys.modules['rich'] = None; " + IMPORT
"""The same in a plain install: ``rich`` comes here only with the development tools
(import-linter), and structlog imports it when it can (for its console tracebacks)."""


def wall(argv: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True)
    return (time.perf_counter() - started) * 1000


def inside(argv: list[str]) -> float:
    done = subprocess.run(argv, check=True, capture_output=True, text=True)
    return float(done.stdout.strip())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args(argv)
    py = sys.executable
    kinds = {
        "python3 -c pass (reference)": lambda: wall([py, "-c", "pass"]),
        "imports to main (inside the process)": lambda: inside([py, "-c", IMPORT]),
        "imports to main, a plain install (no rich)": lambda: inside([py, "-c", WITHOUT_RICH]),
        "python3 -m controller --version": lambda: wall([py, "-m", "controller", "--version"]),
    }
    samples: dict[str, list[float]] = {k: [] for k in kinds}
    names = list(kinds)
    for name in names:  # one warm-up each: the bytecode and the page cache
        kinds[name]()
    print(f"load average at the start: {loadavg()}")
    for i in range(args.rounds):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            samples[name].append(kinds[name]())
    print(f"load average at the end: {loadavg()}")
    reference = statistics.median(samples[names[0]])
    rows = []
    for name in names:
        med = statistics.median(samples[name])
        target = "<= 150 ms" if name.startswith("imports") else "-"
        met = ("yes" if med <= 150 else "NO") if name.startswith("imports") else "-"
        rows.append(
            [name, str(len(samples[name])), f"{med:.0f} ms", f"{med / reference:.2f}x", target, met]
        )
    print_table(["what", "n", "median", "vs python3 -c pass", "target", "met?"], rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
