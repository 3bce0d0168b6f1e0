"""``gpufrag demo``: the whole path, working together, on a local control plane in a few minutes.

What it runs, in order, and why each piece is the real one:

1. **A fragmented "before" cluster.** Fake GPU nodes of mixed products on the real control plane
   (:mod:`devkit.controlplane`), long-running batch pods, and model Deployments whose first
   replicas were *bound directly* where a spreading scheduler puts them (the emptiest node, a
   fresh GPU each) — the state a cluster is in before gpufrag is installed.
2. **gpufrag-scheduler**: the upstream kube-scheduler calling ``gpufrag extender`` (filter,
   prioritize, bind) as a subprocess. Traffic grows, the Deployments scale up, and each new
   replica is placed by FGD blended with model-version affinity. Cold loads avoided are counted
   from the extender's own bind log: a replica bound to a node that already ran its model
   version skips the image pull and weight load.
3. **Serving**: one ``gpufrag serve --model builtin:resnet-small`` process per Deployment stands
   in for its pods (real HTTP, real dynamic batching, a real model on the CPU), driven by an
   open-loop Poisson load generator; request p99 is measured from each request's scheduled send
   time, so a stalled server cannot hide its queueing.
4. **GPU memory** goes through the node agent's own code path (``defrag.agent.cli.main`` with its
   NVML hook): NVML readings → pid → cgroup → pod → the ``gpufrag.io/gpu-usage`` annotation on
   each Node. Without a GPU (the usual case on a laptop or CI) the NVML answers are replayed from
   recorded per-model figures, and the demo says so; with a GPU, a stand-in's live NVML reading
   replaces its model's recorded figure.
5. **One defrag cycle**: ``gpufrag defrag`` against the cluster, not a dry run. It plans moves,
   writes placement hints, evicts through the Eviction API (PDBs respected), and the extender
   steers each replacement to the hinted node.
6. **Before/after**: fragmentation ratio, waste ratio, free whole GPUs (measured by the defrag
   controller's own functions from what the API server holds), cold loads avoided, request p99 —
   printed as a table, written to ``DIR/demo_summary.json`` and plotted to ``DIR/demo.png``.

Everything it starts is stopped at the end or on Ctrl-C / SIGTERM; ``--keep-running`` leaves the
cluster up (with the extender, the scheduler and the stand-ins) until Ctrl-C.

The package, one module per job: :mod:`~devkit.demo.scenario` (the scenario as plain data),
:mod:`~devkit.demo.before` (the spread "before" placement), :mod:`~devkit.demo.coldloads`,
:mod:`~devkit.demo.nvml_replay` (recorded NVML through the node agent),
:mod:`~devkit.demo.load` (stand-ins and the load generator), :mod:`~devkit.demo.summary`,
:mod:`~devkit.demo.run` (the orchestration) and :mod:`~devkit.demo.cli`.
"""

import shutil  # re-exported: the CLI's Go check looks up ``shutil.which``; tests patch it here

from devkit.build import BINARY_ENV
from devkit.demo.before import LegacyPod, spread_placement
from devkit.demo.cli import build_parser, main
from devkit.demo.coldloads import ColdLoads
from devkit.demo.nvml_replay import FakeProcRoot, GpuPod, live_model_memory, recorded_gpus
from devkit.demo.run import Demo, DemoError, run_demo
from devkit.demo.scenario import (
    A10,
    A100,
    BATCH_PODS,
    DEPLOYMENTS,
    T4,
    V100,
    BatchPod,
    ModelDeployment,
    NodeShape,
    node_layout,
)
from devkit.demo.summary import DemoOptions, DemoSummary
from gpufrag.errors import BadInput

__all__ = [
    "A10",
    "A100",
    "BATCH_PODS",
    "BINARY_ENV",
    "DEPLOYMENTS",
    "T4",
    "V100",
    "BadInput",
    "BatchPod",
    "ColdLoads",
    "Demo",
    "DemoError",
    "DemoOptions",
    "DemoSummary",
    "FakeProcRoot",
    "GpuPod",
    "LegacyPod",
    "ModelDeployment",
    "NodeShape",
    "build_parser",
    "live_model_memory",
    "main",
    "node_layout",
    "recorded_gpus",
    "run_demo",
    "shutil",
    "spread_placement",
]
