"""``gpufrag inspect``, with ``--summary`` and ``--plot FILE`` beside its per-node view.

Without either flag this is :func:`defrag.controller.inspect.main`, untouched. With them, the
same read and the same document (:func:`defrag.controller.inspect.view`: the defrag cycle's
own snapshot and measure), then the fleet in a few lines (:mod:`defrag.fleet.summary`) and/or
one picture of every GPU (:mod:`defrag.fleet.picture`). The flags are added to inspect's own
parser, so every other flag means what it means there. The summary also reads the defrag
state on the hints ConfigMap (a live cluster only; a ``get`` the shipped read-only role may
not grant: then the summary says the evictions are not readable, and why).

Why a module of its own and not more of ``defrag/controller/inspect.py``: the summary and the
picture are views over inspect's document and need nothing of the cycle; this module is the
command's entry point (``gpufrag.cli``) so inspect stays one reader and one document.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from defrag.controller import inspect
from defrag.controller.convergence import DefragState, parse_state
from defrag.controller.errors import ApiRefusal, call_api_or_refusal
from defrag.fleet import picture
from defrag.fleet.summary import iso, summarize
from gpufrag.conventions import KubeNames, names_from_environ
from gpufrag.errors import EXIT_BAD_INPUT, EXIT_FAILURE, EXIT_OK, BadInput
from gpufrag.logs import configure
from gpufrag.plotting import PlottingUnavailable, pyplot
from scheduler.kube.client import api_client

PROG = inspect.PROG


def _parser() -> argparse.ArgumentParser:
    p = inspect.parser()  # the one home of inspect's flags
    p.add_argument("--summary", action="store_true",
                   help="the fleet in a few lines: GPUs used, reserved but idle and free, the "
                        "idle ratio and the nodes over the trigger, and what right-sizing and "
                        "defrag gave back and cost, as far as the cluster records it "
                        "(-o json|yaml: as data)")
    p.add_argument("--plot", metavar="FILE", type=Path,
                   help="draw every GPU, node by node (used, reserved but idle, free; nodes "
                        "over the trigger marked) into FILE (.png or .svg)")
    return p


def _cluster_name(args: argparse.Namespace) -> str:
    """What the picture and the summary call the cluster: the snapshot file, the kubeconfig
    context, or ``in-cluster``."""
    if args.snapshot:
        return Path(args.snapshot).name
    if args.context:
        return str(args.context)
    try:
        _contexts, active = k8s_config.list_kube_config_contexts(  # type: ignore[no-untyped-call]  # untyped upstream
            config_file=args.kubeconfig)
    except Exception:  # no kubeconfig: the in-cluster account (api_client's own fallback)
        return "in-cluster"
    return str((active or {}).get("name") or "this cluster")


def _defrag_state(args: argparse.Namespace, names: KubeNames) -> tuple[DefragState | None, str]:
    """The defrag state the cycles left on the hints ConfigMap, or None and why not."""
    where = f"ConfigMap {names.hints_namespace}/{names.hints_configmap}"
    if args.snapshot:
        return None, "a snapshot holds no defrag state: it is on the hints ConfigMap"
    core: Any = k8s.CoreV1Api(api_client(args.kubeconfig, args.context))
    answer = call_api_or_refusal(f"reading {where}", lambda: core.read_namespaced_config_map(
        names.hints_configmap, names.hints_namespace, _preload_content=False), ok=(403, 404))
    if isinstance(answer, ApiRefusal):
        why = ("no defrag cycle has written it yet" if answer.status == 404
               else "this account may not get it")
        return None, f"{where} not readable: {why}"
    obj: dict[str, Any] = orjson.loads(answer.data)
    text = ((obj.get("metadata") or {}).get("annotations") or {}).get(
        names.annotation_defrag_state)
    if not isinstance(text, str) or not text:
        return None, f"{where} holds no defrag state yet (no cycle has run)"
    try:
        return parse_state(text, source=f"{where} annotation {names.annotation_defrag_state}"), ""
    except BadInput as e:
        return None, f"unreadable: {e}"


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if not args.summary and args.plot is None:
        return inspect.main(argv)
    configure()
    names = names_from_environ()
    try:
        if args.plot is not None:  # a picture that cannot be drawn is known before the read
            picture.check_target(args.plot)
            pyplot()
        seen = inspect.inspect_cluster(args, names)
        source, snapshot, doc = seen.source, seen.snapshot, seen.doc
        problems = seen.problems
        cluster = _cluster_name(args)
        drawn = (picture.draw(doc, args.plot, cluster=cluster, at=iso(source.now))
                 if args.plot is not None else None)
        state, state_note = (_defrag_state(args, names) if args.summary else (None, ""))
    except (BadInput, PlottingUnavailable) as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except Exception as e:  # API refusals, connection errors, a disk that filled up
        print(f"{PROG}: failed: {e}", file=sys.stderr)
        return EXIT_FAILURE
    out: dict[str, Any] = {}
    if args.summary:
        out["summary"] = summarize(doc, cluster=cluster, now=source.now,
                                   pod_objects=source.pods, pods=snapshot.pods, state=state,
                                   state_note=state_note, names=names,
                                   namespace=args.namespace)
    if drawn is not None:
        out["plot"] = {"path": str(drawn.path), "form": drawn.form, "nodes": drawn.nodes,
                       "nodes_marked": drawn.marked, "bytes": drawn.size_bytes}
    notes = [n for n in (source.note,) if n] + [f"skipped: {p}" for p in problems]
    if args.output in ("json", "yaml"):
        data = {**({"summary": out["summary"].as_dict()} if "summary" in out else {}),
                **({"plot": out["plot"]} if "plot" in out else {}), "notes": notes}
        print(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode() if args.output == "json"
              else yaml.safe_dump(data, sort_keys=False), end="\n" if args.output == "json"
              else "")
        return EXIT_OK
    if "summary" in out:
        print("\n".join(out["summary"].lines()))
    if drawn is not None:
        print(f"wrote {drawn.path} ({drawn.nodes:,} node(s) as {drawn.form}, "
              f"{drawn.marked:,} over the trigger marked, {drawn.size_bytes:,} bytes)",
              file=sys.stderr)
    for line in notes:
        print(f"note: {line}", file=sys.stderr)
    return EXIT_OK
