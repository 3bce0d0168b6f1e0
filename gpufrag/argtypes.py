"""argparse types shared by the subcommands: a flag's value checked once, at parsing, so a bad
one is a usage error (exit 2) naming the value, never a failure later."""

from __future__ import annotations

import argparse


def positive_float(text: str) -> float:
    """A finite number > 0 (seconds, a rate, a factor)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be > 0")
    return value


def positive_int(text: str) -> int:
    """A whole number > 0 (a count, a page size)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be > 0")
    return value


__all__ = ["positive_float", "positive_int"]
