"""Command-line plumbing shared by the figure scripts: bad input is one line on stderr and exit
code 2, never a traceback."""
import argparse
import sys


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
