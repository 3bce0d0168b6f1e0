"""``gpufrag serve``: parse flags into a validated :class:`ServerConfig` and run the server.

Bad flags print one line (``gpufrag serve: <what is wrong>``) and exit 2, and so does a
``--model`` file that is missing, a directory, empty or not an ONNX model: it is checked before
the server listens (:func:`serving.models.check_model_file`), so the user sees which file is
wrong instead of a traceback after start-up logs. Asking for a GPU backend where none can run
prints why and exits 3.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path

import structlog

from gpufrag import diagnose, logs
from gpufrag.errors import (
    EXIT_BAD_INPUT,
    EXIT_FAILURE,
    EXIT_NO_GPU,
    BadInput,
    BadInputArgumentParser,
)
from gpufrag.loops import EVENT_LOOPS, loop_factory, resolve_event_loop
from serving.backends.tensorrt_engine import BackendUnavailable
from serving.cache import CACHE_ROOT_ENV, MODEL_CACHE_ENV
from serving.config import BACKENDS, GROWTH_WARN_MIB, BatcherConfig, ServerConfig, parse_sizes
from serving.models import check_model_file
from serving.server import serve

PROG = "gpufrag serve"
log = structlog.get_logger("serving.cli")


def build_parser() -> argparse.ArgumentParser:
    d = BatcherConfig()
    p = BadInputArgumentParser(
        prog=PROG, description="Serve one model over the KServe/Triton v2 inference "
                "protocol with a dynamic batcher.")
    p.add_argument("--model", required=True,
                   help="an .onnx file, or builtin:resnet50 / builtin:resnet-medium / "
                   "builtin:resnet-small")
    p.add_argument("--model-name", help="name in the v2 API (default: from --model)")
    p.add_argument("--backend", choices=BACKENDS, default="auto",
                   help="auto: TensorRT when importable and a GPU is present, else ONNX Runtime")
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-batch-size", type=int, default=d.max_batch_size,
                   help="rows per batch at most (default %(default)s)")
    p.add_argument("--max-queue-delay-ms", type=float, default=d.max_queue_delay_s * 1000,
                   help="longest the oldest queued request waits for a fuller batch "
                   "(default %(default)s)")
    p.add_argument("--max-queue-size", type=int, default=d.max_queue_size,
                   help="queued requests at most; beyond it 503 + Retry-After (default "
                   "%(default)s)")
    p.add_argument("--default-timeout-ms", type=float, default=d.default_timeout_s * 1000,
                   help="per-request deadline, and the cap on a client's Timeout-Ms / "
                   "timeout_ms (default %(default)s)")
    p.add_argument("--preferred-batch-sizes", default="",
                   help="comma-separated sizes sent without waiting, e.g. 8,16")
    p.add_argument("--max-concurrent-batches", type=int, default=d.max_concurrent_batches,
                   help="batches computing at once (default %(default)s)")
    p.add_argument("--retry-after-s", type=int, default=d.retry_after_s,
                   help="Retry-After on 503 responses (default %(default)s)")
    p.add_argument("--max-body-bytes", type=int, default=64 * 1024 * 1024,
                   help="larger request bodies get 413 (default %(default)s)")
    p.add_argument("--intra-op-threads", type=int, default=0,
                   help="ONNX Runtime threads per batch (0 = all cores but one, kept for the "
                   "HTTP event loop)")
    p.add_argument("--model-cache-dir", "--model-cache", type=Path, dest="model_cache_dir",
                   help="where built-in models are generated and TensorRT engines cached; "
                   "mount a node-local volume here so a new pod starts warm (default: "
                   f"${MODEL_CACHE_ENV}, else ${CACHE_ROOT_ENV}/models, else "
                   "~/.cache/gpufrag/models, else a temp dir when that is not writable)")
    p.add_argument("--engine-cache-dir", type=Path,
                   help="where TensorRT engines are cached (default <model cache>/engines)")
    p.add_argument("--gpu-memory-growth-warn-mib", type=float, default=GROWTH_WARN_MIB,
                   help="warn when GPU memory grows more than this over one batch (default: "
                        "100 MB, 95.37 MiB)")
    p.add_argument("--allow-non-finite", action="append", default=[], metavar="INPUT",
                   help="accept NaN/Inf in this float input (binary tensor data only: JSON "
                   "has no NaN); repeat for more inputs. Default: rejected with 400")
    p.add_argument("--shutdown-timeout-s", type=float, default=30.0,
                   help="longest the SIGTERM drain may take, after the drain delay "
                   "(default %(default)s)")
    p.add_argument("--drain-delay-s", type=float, default=ServerConfig.drain_delay_s,
                   help="after SIGTERM, keep admitting and answering requests this long with "
                   "readiness already 503, so the endpoint is removed before admission closes "
                   "(0 when a preStop hook already waits; default %(default)s)")
    p.add_argument("--event-loop", choices=EVENT_LOOPS, default="auto",
                   help="auto: uvloop when installed, else asyncio's own loop (default "
                   "%(default)s)")
    p.add_argument("--debug-port", type=int, default=0,
                   help="serve GET /debug/memory (allocation growth by site, tracemalloc, and "
                        "each GPU's used memory) on 127.0.0.1 at this port; tracing costs a "
                        "few percent of CPU, so 0 (the default) turns it off")
    p.add_argument("--log-level", default=None, help="debug, info, warning, error")
    return p


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    batcher = BatcherConfig(
        max_batch_size=args.max_batch_size,
        max_queue_delay_s=args.max_queue_delay_ms / 1000.0,
        max_queue_size=args.max_queue_size,
        default_timeout_s=args.default_timeout_ms / 1000.0,
        preferred_batch_sizes=parse_sizes(args.preferred_batch_sizes, "--preferred-batch-sizes"),
        max_concurrent_batches=args.max_concurrent_batches,
        retry_after_s=args.retry_after_s,
    )
    return ServerConfig(
        model=args.model, batcher=batcher, model_name=args.model_name, backend=args.backend,
        model_cache_dir=args.model_cache_dir, engine_cache_dir=args.engine_cache_dir,
        host=args.host, port=args.port, max_body_bytes=args.max_body_bytes,
        intra_op_threads=args.intra_op_threads,
        gpu_memory_growth_warn_mib=args.gpu_memory_growth_warn_mib,
        shutdown_timeout_s=args.shutdown_timeout_s, drain_delay_s=args.drain_delay_s,
        allow_non_finite_inputs=tuple(args.allow_non_finite),
        event_loop=args.event_loop, debug_port=args.debug_port,
    ).validate()


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
        config = config_from_args(args)
        event_loop = resolve_event_loop(config.event_loop)
        check_model_file(config.model)  # a typo or a broken file fails here, not listening
    except SystemExit as exc:  # --help
        return int(exc.code or 0)
    except BadInput as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    logs.configure(args.log_level)
    diagnose.install("serve")
    try:
        with asyncio.Runner(loop_factory=loop_factory(event_loop)) as runner:
            return runner.run(serve(config))
    except BadInput as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BackendUnavailable as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return EXIT_NO_GPU
    except OSError as exc:  # port in use, unreadable model file
        print(f"{PROG}: {exc}", file=sys.stderr)
        return EXIT_FAILURE


if __name__ == "__main__":
    sys.exit(main())
