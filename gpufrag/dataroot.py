"""Where the shared trace data lives: one setting, found from this file, never from the cwd.

DESIGN.md keeps the traces (``openb/``, ``genai/``, ``kss/``) in a ``shared/data`` folder beside
the repository, read in place. The what-if's defaults, the benchmarks' ``--data`` defaults and the
tests that check published claims all read them. Each used to look for ``../shared/data`` from
the current directory, so a command or a test run started anywhere but the repository root
silently got the synthetic stand-in, or skipped. Here the place is settled once, the same for
everyone:

- ``GPUFRAG_DATA_ROOT`` when set (a relative value is taken from the current directory, as any
  path given on a command line);
- else :data:`BESIDE_REPO`: ``shared/data`` beside the folder that holds the ``gpufrag``
  package, i.e. ``<repository>/../shared/data`` for a checkout (an installed package has no
  such folder beside it, so it finds nothing there and says so).

Where the data is missing, product defaults fall back to the synthetic generator and log
:func:`fallback_line`; the tests skip with a named reason (tests/skips.py).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

ENV: Final = "GPUFRAG_DATA_ROOT"
# parents[0] is gpufrag/, parents[1] the repository, parents[2] the folder that holds it.
BESIDE_REPO: Final = Path(__file__).resolve().parents[2] / "shared" / "data"


def data_root() -> Path:
    """The folder holding ``openb/``, ``genai/`` and ``kss/``: ``GPUFRAG_DATA_ROOT`` (read now,
    so a test can set it) or :data:`BESIDE_REPO`. Whether it exists is the caller's question."""
    given = os.environ.get(ENV, "").strip()
    return Path(given).expanduser().absolute() if given else BESIDE_REPO


def fallback_line(path: Path, what: str) -> str:
    """The one wording of "the default trace is missing, the synthetic stand-in runs instead",
    naming the path looked at and how to point elsewhere, so no fallback is silent."""
    return (f"no {what} at {path}: using the synthetic stand-in (the data root is {ENV}, "
            f"default {BESIDE_REPO})")
