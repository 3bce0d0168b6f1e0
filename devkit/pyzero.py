"""The zero-cost extender on gpufrag's own Python stack: the floor under issue 47's targets.

The Go zero-cost extender (devkit/cluster/zeroextender.go) is the limit of the extender
design; this is the limit of *gpufrag's* way of serving it: the same HTTP server
(:mod:`gpufrag.httpserve`, uvicorn on httptools behind the project's door and body gateway),
Flask answering every route, filter and prioritize answered on the event loop as the extender
answers them (:func:`scheduler.extender.app.inline_verbs`), and binds written by the
extender's own binder (:class:`scheduler.kube.binder.KubeBinder`) on request threads. It has
no logic: no cluster cache, no watch, no scoring. What it costs per pod, beside the Go row in
the same run of ``benchmarks/scheduling_throughput``, is what any Flask extender on this
server costs before it decides anything, so gpufrag's figure can be read against it.

Usage: ``python -m devkit.pyzero --kubeconfig FILE --port N [--mode all|one]`` (the Go
extender's flags and answers; ``GET /readyz`` answers at once).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import orjson
from flask import Flask, Response, request

from gpufrag.conventions import KubeNames
from gpufrag.httpserve import Limits, Server, listen
from scheduler.extender.app import inline_verbs
from scheduler.kube.binder import Binder, BindError, KubeBinder
from scheduler.kube.client import api_client

MODES = ("all", "one")
# As the benchmark runs gpufrag's extender (--threads 16).
THREADS = 16


def _json(payload: Any) -> Response:
    return Response(orjson.dumps(payload), mimetype="application/json")


def _names(args: dict[str, Any]) -> list[str]:
    names = args.get("NodeNames")
    if names is not None:
        return list(names)
    return [node["metadata"]["name"] for node in (args.get("Nodes") or {}).get("items") or ()]


def create_app(binder: Binder, *, one_node: bool) -> Flask:
    """The Go zero-cost extender's four verbs and answers, as Flask routes."""
    app = Flask("gpufrag-pyzero")

    @app.post("/filter")
    def filter_() -> Response:
        args = orjson.loads(request.get_data())
        result = {"Nodes": args.get("Nodes"), "NodeNames": args.get("NodeNames"),
                  "FailedNodes": {}, "Error": ""}
        if one_node and result["NodeNames"] is not None:
            result["NodeNames"] = result["NodeNames"][:1]
        if one_node and result["Nodes"] is not None:
            result["Nodes"] = {**result["Nodes"], "items": result["Nodes"]["items"][:1]}
        return _json(result)

    @app.post("/prioritize")
    def prioritize() -> Response:
        return _json([{"Host": name, "Score": 0}
                      for name in _names(orjson.loads(request.get_data()))])

    @app.post("/preempt")
    def preempt() -> Response:
        args = orjson.loads(request.get_data())
        victims = args.get("NodeNameToMetaVictims")
        if victims is None:
            victims = {node: {"Pods": [{"UID": pod["metadata"]["uid"]}
                                       for pod in found.get("Pods") or ()],
                              "NumPDBViolations": found.get("NumPDBViolations", 0)}
                       for node, found in (args.get("NodeNameToVictims") or {}).items()}
        return _json({"NodeNameToMetaVictims": victims})

    @app.post("/bind")
    def bind() -> Response:
        args = orjson.loads(request.get_data())
        error = ""
        try:
            binder.bind(args["PodNamespace"], args["PodName"], args.get("PodUID") or "",
                        args["Node"], None)
        except BindError as e:
            error = str(e)
        return _json({"Error": error})

    @app.get("/readyz")
    def readyz() -> Response:
        return Response(b"ok\n", content_type="text/plain; charset=utf-8")

    return app


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devkit.pyzero", description=__doc__.split(
        "\n\n")[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8889)
    parser.add_argument("--mode", choices=MODES, default="all")
    args = parser.parse_args(argv)
    binder = KubeBinder(api_client(args.kubeconfig), KubeNames(), pool_size=THREADS)
    sock = listen(args.host, args.port, setting="--host, --port")
    server = Server(create_app(binder, one_node=args.mode == "one"), sock,
                    Limits(threads=THREADS), name="pyzero", inline=inline_verbs(""))
    print(f"pyzero: serving on {args.host}:{server.port} (mode {args.mode})", file=sys.stderr)
    server.run(signals=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
