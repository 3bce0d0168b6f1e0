"""``gpufrag demo``'s command line: options, exit codes, and Ctrl-C / SIGTERM handling."""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from devkit.build import BINARY_ENV, BuildError
from devkit.demo.run import DemoError, run_demo
from devkit.demo.summary import MAX_NODES, MIN_NODES, DemoOptions
from devkit.procs import ControlPlaneError
from gpufrag.errors import EXIT_BAD_INPUT, EXIT_FAILURE, EXIT_OK, BadInput, BadInputArgumentParser

PROG = "gpufrag demo"
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it


def build_parser() -> argparse.ArgumentParser:
    d = DemoOptions()
    p = BadInputArgumentParser(
        prog=PROG, description="Show the whole gpufrag path on a local control plane: "
                "fragmented fake GPU nodes, gpufrag-scheduler with model affinity, gpufrag serve "
                "stand-ins under load, GPU memory through the node agent, one defrag cycle, and "
                "a before/after summary (table, JSON, PNG).")
    p.add_argument("--out", type=Path, default=d.out,
                   help="where demo_summary.json, demo.png and logs/ go (default: %(default)s)")
    p.add_argument("--nodes", type=int, default=d.nodes,
                   help=f"fake GPU nodes, {MIN_NODES}..{MAX_NODES} (default: %(default)s)")
    p.add_argument("--seed", type=int, default=d.seed,
                   help="seed of the spread placement order and the load (default: %(default)s)")
    p.add_argument("--load-s", type=float, default=d.load_s,
                   help="seconds of open-loop load before and after (default: %(default)s)")
    p.add_argument("--rate", type=float, default=d.rate_per_s,
                   help="requests per second to each stand-in (default: %(default)s)")
    p.add_argument("--keep-running", action="store_true",
                   help="leave the cluster, scheduler and stand-ins up until Ctrl-C and print "
                        "the kubeconfig")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
        options = DemoOptions(out=args.out, nodes=args.nodes, seed=args.seed,
                              load_s=args.load_s, rate_per_s=args.rate,
                              keep_running=args.keep_running).validate()
    except SystemExit as e:  # --help
        return int(e.code or 0)
    except BadInput as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if not os.environ.get(BINARY_ENV) and shutil.which("go") is None:
        print(f"{PROG}: Go is not installed (no 'go' on PATH): the local control plane is built "
              f"from upstream Kubernetes with Go >= 1.26; install Go, or set {BINARY_ENV} to a "
              "binary built by devkit/cluster/build", file=sys.stderr)
        return EXIT_FAILURE

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, interrupt)  # clean up as on Ctrl-C
    try:
        summary = run_demo(options)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted; everything it started is stopped", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BuildError as e:
        print(f"{PROG}: building the control plane failed: {e}", file=sys.stderr)
        return EXIT_FAILURE
    except BadInput as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (DemoError, ControlPlaneError, TimeoutError) as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return EXIT_FAILURE
    if summary.defrag["exit_code"] != 0:
        print(f"{PROG}: the defrag cycle exited {summary.defrag['exit_code']}; see "
              f"{options.out / 'logs' / 'defrag.log'}", file=sys.stderr)
        return EXIT_FAILURE
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
