"""Drive a running ``gpufrag serve`` with KServe's own ``InferenceRESTClient``.

Run with the interpreter of the separate ``kserve`` venv (``devkit/clientvenv.py``; ``kserve``
cannot be installed into the project's venv), not collected by pytest:

    python kserve_client_check.py BASE_URL MODEL INPUT.npy

It checks server liveness and readiness and the model's readiness, infers ``INPUT.npy`` once
with JSON and once with binary ``InferInput`` tensors, and prints what KServe's client made of
every answer as one JSON object on stdout; ``test_serving_clients.py`` compares it with the
model run directly. Any exception exits non-zero with its traceback on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
from typing import Any

import kserve
import numpy as np


async def check(base_url: str, model: str, x: np.ndarray[Any, Any]) -> dict[str, Any]:
    client = kserve.InferenceRESTClient(kserve.RESTConfig(protocol="v2", timeout=30))
    try:
        report: dict[str, Any] = {
            "kserve_version": importlib.metadata.version("kserve"),
            "server_live": await client.is_server_live(base_url),
            "server_ready": await client.is_server_ready(base_url),
            "model_ready": await client.is_model_ready(base_url, model),
            "unknown_model_ready": await client.is_model_ready(base_url, "no-such-model"),
            "infer": {},
        }
        for mode in ("json", "binary"):
            tensor = kserve.InferInput("input", list(x.shape), "FP32")
            tensor.set_data_from_numpy(x, binary_data=mode == "binary")
            request = kserve.InferRequest(model_name=model, infer_inputs=[tensor],
                                          request_id=f"kserve-{mode}")
            response = await client.infer(base_url, request, model_name=model)
            report["infer"][mode] = {
                "model_name": response.model_name,
                "id": response.id,
                "outputs": [{"name": out.name, "shape": list(out.shape),
                             "datatype": out.datatype, "data": out.as_numpy().tolist()}
                            for out in response.outputs],
            }
        return report
    finally:
        await client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base_url")
    parser.add_argument("model")
    parser.add_argument("input", help="a .npy file: the FP32 batch to infer")
    args = parser.parse_args()
    x = np.load(args.input)
    print(json.dumps(asyncio.run(check(args.base_url, args.model, x))))


if __name__ == "__main__":
    main()
