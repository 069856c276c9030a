"""The command line of a file generated from the models (the CRD, its reference): write it, or --check it."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path


def main(argv: list[str] | None, *, prog: str, description: str, default_output: Path,
         render: Callable[[], str]) -> tuple[int, Path | None]:
    """Writes `render()` to `--output` (default `default_output`), or with `--check` compares it.

    Args:
      argv: command-line arguments (None: `sys.argv[1:]`).
      prog: the module's `python -m` name, also named in the "stale" message.

    Returns:
      (exit code, the path written or None): 1 when `--check` found the file stale (a message on
      stderr says how to regenerate it), else 0.

    Raises:
      OSError: the file cannot be written.
    """
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--check", action="store_true", help="exit 1 if the file differs from the models")
    parser.add_argument("--output", type=Path, default=default_output)
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = args.output.read_text() if args.output.exists() else ""
        if current != text:
            print(f"{args.output} is stale: run {prog}", file=sys.stderr)
            return 1, None
        return 0, None
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text)
    return 0, args.output
