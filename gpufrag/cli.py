"""The one ``gpufrag`` command: a subcommand per job.

Each subcommand lives next to the code it runs and exposes ``main(argv) -> int``. Modules are
named here as strings and imported only when their subcommand is chosen, so ``gpufrag whatif``
never loads Flask or the Kubernetes client, and this module, the top of the import layers,
imports no component statically. ``dev-cluster`` and ``demo`` belong to the dev kit
(``devkit/``), which a source checkout has and the production image does not: there they answer
with one line saying so.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from importlib import metadata

from gpufrag.errors import EXIT_BAD_INPUT, EXIT_OK, BadInput

DEV_KIT = "devkit"

# name -> (module exposing main(argv) -> int, one-line description)
COMMANDS: dict[str, tuple[str, str]] = {
    "whatif": ("simulations.cli", "replay a cluster trace through each placement policy"),
    "extender": ("scheduler.extender.cli", "run the kube-scheduler extender webhook"),
    "export-snapshot": ("scheduler.kube.export", "write a live cluster's nodes and pods to a file"),
    "defrag": ("defrag.controller.cli", "run one defragmentation cycle (CronJob)"),
    "inspect": ("defrag.fleet.cli", "who holds each GPU, what it uses, what sits idle; the "
                "fleet in a summary or a picture (read-only; a live cluster or a snapshot)"),
    "admission": ("defrag.admission.cli", "right-size GPU shares of new pods (mutating webhook)"),
    "agent": ("node.agent.cli", "publish per-GPU usage read through NVML (DaemonSet)"),
    "device-plugin": ("node.deviceplugin.cli", "hand each container the GPUs the extender "
                      "chose (kubelet device plugin, DaemonSet)"),
    "dra-plugin": ("node.dra.cli", "publish this node's GPUs as a DRA ResourceSlice and prepare "
                   "the claims allocated on them (kubelet DRA plugin, DaemonSet)"),
    "serve": ("serving.cli", "serve a model with dynamic batching (v2 inference protocol)"),
    "dev-cluster": ("devkit.cli", "start or stop a local control plane to try by hand (dev kit)"),
    "demo": ("devkit.demo", "show the whole path on a local control plane"),
}


def version() -> str:
    """The installed distribution's version (the source tree's when run uninstalled)."""
    try:
        return metadata.version("gpufrag")
    except metadata.PackageNotFoundError:
        return "0+unknown"


def _usage() -> str:
    width = max(len(n) for n in COMMANDS)
    lines = ["usage: gpufrag <command> [options]   (gpufrag --version)", "", "commands:"]
    lines += [f"  {name:<{width}}  {desc}" for name, (_, desc) in COMMANDS.items()]
    lines += ["", "Run 'gpufrag <command> --help' for a command's options."]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in {"-h", "--help", "help"}:
        print(_usage())
        return EXIT_OK
    if args[0] in {"-V", "--version"}:
        print(f"gpufrag {version()}")
        return EXIT_OK
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(f"gpufrag: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return EXIT_BAD_INPUT
    module_name = COMMANDS[name][0]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name != DEV_KIT or not module_name.startswith(DEV_KIT + "."):
            raise
        print(f"gpufrag: {name!r} is part of the dev kit, which this installation does not "
              "have; run it from a source checkout (pip install -e .)", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        result: int = module.main(rest)
    except BadInput as e:  # a command that let one through still answers with one line
        print(f"gpufrag {name}: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return result


if __name__ == "__main__":
    sys.exit(main())
