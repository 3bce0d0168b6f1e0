"""Read a snapshot file and nothing else: the floor every command reading one pays, the
reference ``benchmarks.inspect_scale`` measures ``gpufrag inspect`` against.

    python -m benchmarks.snapshot_read SNAPSHOT
"""

from __future__ import annotations

import sys

from scheduler.kube.snapshot import read_snapshot


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("snapshot_read: give one snapshot file", file=sys.stderr)
        return 2
    read_snapshot(args[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
