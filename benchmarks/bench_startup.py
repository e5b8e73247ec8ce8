"""Start-up time of the command line: ``draftsim ewif --alpha 0.8 --cost 0.05`` and ``draftsim --help``.

Run: ``.venv/bin/python benchmarks/bench_startup.py [--runs 7]``. Goal (issue 39): ``draftsim ewif``
prints in <= 0.5 s on a quiet machine. Each command runs as a fresh process (the installed
``draftsim`` script beside this Python, else ``python -m draftsim.cli``), the commands
alternately so that load on the machine falls on all of them alike; the median wall time of
each, and its ratio to ``python -c pass`` (the interpreter's own start) and to
``python -c "import numpy"`` (the floor of any command that computes), all from this one run;
and ``draftsim ewif`` with every command module imported first, as it started before the
command table (:mod:`draftsim.commands.table`).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

#: ``draftsim ewif`` as it started before the command table: every command module imported first.
EAGER = ("import importlib, sys\n"
         "from draftsim.commands.table import TABLE\n"
         "for entry in TABLE:\n"
         "    importlib.import_module(entry.qualified_module)\n"
         "from draftsim.cli import main\n"
         "sys.exit(main(['ewif', '--alpha', '0.8', '--cost', '0.05']))\n")


def draftsim_command() -> list[str]:
    script = Path(sys.executable).with_name("draftsim")
    return [str(script)] if script.exists() else [sys.executable, "-m", "draftsim.cli"]


def wall(argv: list[str]) -> float:
    t0 = time.perf_counter()
    done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seconds = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="runs of each command (default 7)")
    runs = parser.parse_args().runs
    if runs < 1:
        parser.error(f"--runs must be >= 1; got {runs}")
    draftsim = draftsim_command()
    cases = {
        "python -c pass": [sys.executable, "-c", "pass"],
        'python -c "import numpy"': [sys.executable, "-c", "import numpy"],
        "draftsim --help": [*draftsim, "--help"],
        "draftsim ewif --alpha 0.8 --cost 0.05": [*draftsim, "ewif", "--alpha", "0.8", "--cost", "0.05"],
        "the same, every command module imported": [sys.executable, "-c", EAGER],
    }
    for argv in cases.values():  # warm the file cache and the bytecode
        wall(argv)
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(runs):
        for name, argv in cases.items():
            times[name].append(wall(argv))
    median = {name: statistics.median(t) for name, t in times.items()}
    python, numpy = median["python -c pass"], median['python -c "import numpy"']
    print(f"{shutil.which(draftsim[0]) or draftsim[0]}: median of {runs} runs each, alternately")
    print(f"{'command':42s} {'median s':>9s} {'min s':>7s} {'x python':>9s} {'x numpy':>8s}")
    for name, t in times.items():
        print(f"{name:42s} {median[name]:9.3f} {min(t):7.3f} {median[name] / python:9.1f} {median[name] / numpy:8.2f}")
    ewif = median["draftsim ewif --alpha 0.8 --cost 0.05"]
    eager = median["the same, every command module imported"]
    print(f"draftsim ewif: {ewif:.3f} s, {eager / ewif:.1f}x faster than importing every command module "
          f"(goal <= 0.5 s on a quiet machine: {'met' if ewif <= 0.5 else 'NOT met'})")


if __name__ == "__main__":
    main()
