"""Command-line plumbing shared by the figure scripts: bad input is one line on stderr and exit
code 2, never a traceback; independent runs in parallel processes."""
import argparse
import sys
from concurrent.futures import ProcessPoolExecutor

import torch


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but an unknown flag or a bad value is one line: `<prog>: error: <message>`."""

    def error(self, message):
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        sys.exit(2)


def run(main):
    """Call main(); a ValueError (how the library reports bad input) becomes a one-line error, exit 2."""
    try:
        main()
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


def _one_thread():
    torch.set_num_threads(1)


def parallel_map(fn, jobs, processes: int) -> list:
    """[fn(job) for job in jobs], in order, in `processes` worker processes with one torch thread each:
    on a few CPU cores independent runs go faster that way than as one process with several threads,
    and every run computes the same numbers whatever `processes` is. fn must be a module-level function."""
    with ProcessPoolExecutor(processes, initializer=_one_thread) as pool:
        return list(pool.map(fn, jobs))
