"""Command-line parsing shared by the benchmark scripts that take config overrides."""

from __future__ import annotations

import argparse


def parse(ap: argparse.ArgumentParser, command: str = "run") -> argparse.Namespace:
    """``ap``'s arguments, where the overrides (``key=value``) of the ``command`` subcommand may
    also come after its options; anything else unknown is an error."""
    args, extra = ap.parse_known_args()
    if extra and (args.cmd != command or any("=" not in e or e.startswith("-") for e in extra)):
        ap.error(f"unrecognized arguments: {' '.join(extra)}")
    args.overrides = [*getattr(args, "overrides", []), *extra]
    return args
