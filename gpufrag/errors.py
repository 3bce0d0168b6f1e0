"""Errors that mean "the input is wrong", as opposed to "something broke".

Every command turns a :class:`BadInput` into one line on stderr and exit code 2, so users
see which file, row and field to fix instead of a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import NoReturn

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_BAD_INPUT = 2
EXIT_NO_GPU = 3


class BadInput(ValueError):
    """Input that cannot be used as given; the message names what is wrong and where."""

    def __init__(self, message: str, *, source: str | None = None, row: int | None = None,
                 field: str | None = None) -> None:
        self.detail = message  # without the place: for re-raising at another place
        self.source = source
        self.row = row
        self.field = field
        where = []
        if source is not None:
            where.append(source)
        if row is not None:
            where.append(f"row {row}")
        if field is not None:
            where.append(f"field {field!r}")
        prefix = ", ".join(where)
        super().__init__(f"{prefix}: {message}" if prefix else message)


class BadInputArgumentParser(argparse.ArgumentParser):
    """argparse that raises :class:`BadInput` for a bad flag instead of printing usage and
    exiting, so a command reports it like any other bad input: one line, exit code 2."""

    def error(self, message: str) -> NoReturn:
        raise BadInput(message)

    def parse_or_exit_code(self, argv: Sequence[str] | None) -> argparse.Namespace | int:
        """The parsed flags, or the exit code once a bad flag has been reported in one line
        on stderr (``<prog>: <what> (see <prog> --help)``) or ``--help`` has been printed."""
        try:
            return self.parse_args(None if argv is None else list(argv))
        except BadInput as exc:
            print(f"{self.prog}: {exc} (see {self.prog} --help)", file=sys.stderr)
            return EXIT_BAD_INPUT
        except SystemExit as exc:  # --help: argparse printed it and exits 0
            return EXIT_OK if exc.code in (None, 0) else EXIT_BAD_INPUT
