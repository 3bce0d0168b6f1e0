"""``gpufrag demo``: the whole path, working together, on a local control plane in a few minutes.

What it runs, in order, and why each piece is the real one. Every gpufrag component runs one
way, as in a cluster: as its own ``gpufrag <command>`` process. The demo learns what each did
only through the Kubernetes API (:mod:`~devkit.demo.observe`) — pods and their GPU annotation,
the scheduler's Scheduled Events, evictions and placement hints, the agent's Node annotation —
never from a component's log or output:

1. **A fragmented "before" cluster.** Fake GPU nodes of mixed products on the real control plane
   (:mod:`devkit.controlplane`), long-running batch pods, and model Deployments whose first
   replicas were *bound directly* where a spreading scheduler puts them (the emptiest node, a
   fresh GPU each) — the state a cluster is in before gpufrag is installed.
2. **gpufrag-scheduler**: the upstream kube-scheduler calling ``gpufrag extender`` (filter,
   prioritize, bind) as a subprocess. Traffic grows, the Deployments scale up, and each new
   replica is placed by FGD blended with model-version affinity. Cold loads avoided are counted
   from gpufrag-scheduler's Scheduled Events, in bind order: a replica bound to a node that
   already ran its model version skips the image pull and weight load.
3. **Serving**: one ``gpufrag serve --model builtin:resnet-small`` process per Deployment stands
   in for its pods (real HTTP, real dynamic batching, a real model on the CPU), driven by an
   open-loop Poisson load generator; request p99 is measured from each request's scheduled send
   time, so a stalled server cannot hide its queueing.
4. **GPU memory** goes through the node agent: one ``gpufrag agent --once`` process per node,
   NVML readings → pid → cgroup → pod → the ``gpufrag.io/gpu-usage`` annotation on each Node.
   The nodes are fake, so the demo writes what each agent reads there: recorded NVML readings
   (``--nvml-recording``, per-model figures) and a proc root whose cgroup files name the pods
   (``--proc-root``); the agent and the demo both say the readings are recorded. With a GPU, a
   stand-in's live NVML reading replaces its model's recorded figure.
5. **One defrag cycle**: ``gpufrag defrag`` against the cluster, not a dry run. It plans moves,
   writes placement hints, evicts through the Eviction API (PDBs respected), and the extender
   steers each replacement to the hinted node. The demo sees the hints, the evictions and the
   replacements through the API; the controller's printed plan goes to ``logs/defrag-plan.txt``.
6. **Before/after**: fragmentation ratio, idle ratio, free whole GPUs (measured by the defrag
   controller's own functions from what the API server holds), cold loads avoided, request p99 —
   printed as a table, written to ``DIR/demo_summary.json`` and plotted to ``DIR/demo.png``.

Everything it starts is stopped at the end or on Ctrl-C / SIGTERM; ``--keep-running`` leaves the
cluster up (with the extender, the scheduler and the stand-ins) until Ctrl-C.

The package, one module per job: :mod:`~devkit.demo.scenario` (the scenario as plain data),
:mod:`~devkit.demo.before` (the spread "before" placement), :mod:`~devkit.demo.coldloads`,
:mod:`~devkit.demo.nvml_replay` (the agent's recordings and proc roots),
:mod:`~devkit.demo.observe` (what the API server shows),
:mod:`~devkit.demo.load` (stand-ins and the load generator), :mod:`~devkit.demo.summary`,
:mod:`~devkit.demo.run` (the orchestration) and :mod:`~devkit.demo.cli`.
"""

import shutil  # re-exported: the CLI's Go check looks up ``shutil.which``; tests patch it here

from devkit.build import BINARY_ENV
from devkit.demo.before import LegacyPod, spread_placement
from devkit.demo.cli import build_parser, main
from devkit.demo.coldloads import ColdLoads
from devkit.demo.nvml_replay import (
    FakeProcRoot,
    GpuPod,
    live_model_memory,
    recorded_gpus,
    recording_json,
    write_recording,
)
from devkit.demo.observe import ClusterObserver, ObservedMove, Scheduled, SeenHint, SeenPod
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
    "ClusterObserver",
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
    "ObservedMove",
    "Scheduled",
    "SeenHint",
    "SeenPod",
    "build_parser",
    "live_model_memory",
    "main",
    "node_layout",
    "recorded_gpus",
    "recording_json",
    "run_demo",
    "shutil",
    "spread_placement",
    "write_recording",
]
