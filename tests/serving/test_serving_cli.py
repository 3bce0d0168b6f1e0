"""``gpufrag serve`` flags: every knob parsed, bad input one line and exit 2."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from gpufrag import cli as gpufrag_cli
from gpufrag.errors import EXIT_BAD_INPUT, EXIT_NO_GPU
from serving import cli as serve_cli
from serving.cli import build_parser, config_from_args, main
from tests import skips


@pytest.fixture(autouse=True)
def _keep_logging_config(monkeypatch: pytest.MonkeyPatch) -> None:
    """main() configures structlog for the process (caching loggers bound to this test's
    captured stderr); keep the test process's logging as it was."""
    monkeypatch.setattr(serve_cli.logs, "configure", lambda *args, **kwargs: None)


def test_every_knob_reaches_the_config() -> None:
    args = build_parser().parse_args([
        "--model", "builtin:resnet50", "--port", "9000", "--max-batch-size", "16",
        "--max-queue-delay-ms", "2.5", "--max-queue-size", "100", "--default-timeout-ms", "800",
        "--preferred-batch-sizes", "4, 8,16", "--max-concurrent-batches", "2",
        "--max-body-bytes", "1000", "--retry-after-s", "3", "--backend", "onnxruntime",
        "--model-name", "rn", "--intra-op-threads", "2", "--gpu-memory-growth-warn-mib", "50",
        "--shutdown-timeout-s", "5", "--model-cache-dir", "/tmp/c", "--event-loop", "asyncio",
    ])
    config = config_from_args(args)
    b = config.batcher
    assert (b.max_batch_size, b.max_queue_delay_s, b.max_queue_size) == (16, 0.0025, 100)
    assert (b.default_timeout_s, b.preferred_batch_sizes) == (0.8, (4, 8, 16))
    assert (b.max_concurrent_batches, b.retry_after_s) == (2, 3)
    assert (config.port, config.max_body_bytes, config.backend) == (9000, 1000, "onnxruntime")
    assert (config.model_name, config.intra_op_threads) == ("rn", 2)
    assert config.gpu_memory_growth_warn_mib == 50 and config.shutdown_timeout_s == 5
    assert config.model_cache_dir == Path("/tmp/c")
    assert config.event_loop == "asyncio"


def test_model_cache_has_a_short_alias_and_no_default_of_its_own() -> None:
    """Unset, the server resolves it at start (env, default, temp fallback: serving.cache)."""
    args = build_parser().parse_args(["--model", "builtin:resnet50", "--model-cache", "/c"])
    assert config_from_args(args).model_cache_dir == Path("/c")
    unset = build_parser().parse_args(["--model", "builtin:resnet50"])
    assert config_from_args(unset).model_cache_dir is None


def test_defaults_match_the_documented_ones() -> None:
    config = config_from_args(build_parser().parse_args(["--model", "builtin:resnet50"]))
    assert config.batcher.max_batch_size == 32
    assert config.batcher.max_queue_delay_s == pytest.approx(0.005)
    assert config.port == 8000 and config.backend == "auto" and config.event_loop == "auto"


@pytest.mark.parametrize(("argv", "needle"), [
    (["--model", "builtin:vgg"], "unknown built-in model builtin:vgg"),
    (["--model", "builtin:resnet-small", "--max-batch-size", "0"],
     "field '--max-batch-size': must be >= 1, got 0"),
    (["--model", "builtin:resnet-small", "--port", "http"], "invalid int value: 'http'"),
    (["--model", "builtin:resnet-small", "--preferred-batch-sizes", "4,x"],
     "'x' is not an integer"),
    (["--model", "builtin:resnet-small", "--preferred-batch-sizes", "64"],
     "64 is outside 1..max batch size 32"),
    (["--model", "builtin:resnet-small", "--backend", "tpu"], "invalid choice: 'tpu'"),
    (["--model", "builtin:resnet-small", "--event-loop", "trio"], "invalid choice: 'trio'"),
    (["--port", "1"], "the following arguments are required: --model"),
    (["--model", "does/not/exist.onnx"], "does not exist"),
])
def test_bad_input_is_one_line_and_exit_2(argv: list[str], needle: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gpufrag serve: ") and needle in err


def test_allow_non_finite_names_reach_the_config() -> None:
    args = build_parser().parse_args(["--model", "builtin:resnet-small", "--allow-non-finite",
                                      "input", "--allow-non-finite", "mask"])
    assert config_from_args(args).allow_non_finite_inputs == ("input", "mask")
    default = build_parser().parse_args(["--model", "builtin:resnet-small"])
    assert config_from_args(default).allow_non_finite_inputs == ()


def test_an_empty_allow_non_finite_name_is_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--model", "builtin:resnet-small", "--allow-non-finite", " "]) == EXIT_BAD_INPUT
    assert "field '--allow-non-finite': needs an input name" in capsys.readouterr().err


@pytest.mark.parametrize(("kind", "needle"), [
    ("missing", "does not exist"),
    ("directory", "is a directory"),
    ("empty", "is empty (0 bytes)"),
    ("random-bytes", "is not an ONNX model: it does not parse as one"),
    ("truncated", "is not an ONNX model: it does not parse as one"),
    ("tensor-proto", "is not an ONNX model: it does not parse as one"),
    ("no-graph", "it parses, but has no graph"),
])
def test_a_broken_model_file_is_one_line_naming_it_and_exit_2_before_listening(
        model_file: Callable[[str], Path], kind: str, needle: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    path = model_file(kind)
    assert main(["--model", str(path), "--port", "0", "--host", "127.0.0.1"]) == EXIT_BAD_INPUT
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and captured.err.startswith("gpufrag serve: ")
    assert str(path) in captured.err and needle in captured.err
    assert captured.out == ""


def test_a_model_only_onnx_runtime_rejects_still_exits_2_with_the_reason(
        model_file: Callable[[str], Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("GPUFRAG_CACHE_DIR", str(tmp_path))
    path = model_file("bad-ir-version")  # parses: found by the load, after listening
    code = main(["--model", str(path), "--backend", "onnxruntime", "--port", "0",
                 "--host", "127.0.0.1", "--log-level", "error"])
    assert code == EXIT_BAD_INPUT
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith(f"gpufrag serve: field '--model': model file '{path}' cannot be "
                           "loaded by ONNX Runtime: Unsupported model IR version: 99")


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    assert "--max-queue-delay-ms" in capsys.readouterr().out


def test_the_gpufrag_command_dispatches_to_serve(capsys: pytest.CaptureFixture[str]) -> None:
    assert gpufrag_cli.main(["serve", "--model", "builtin:nope"]) == EXIT_BAD_INPUT
    assert "unknown built-in model" in capsys.readouterr().err


def test_tensorrt_where_it_cannot_run_exits_3_with_the_reason(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    import importlib.util

    if importlib.util.find_spec("tensorrt") is not None:
        skips.skip(skips.TENSORRT_PRESENT)
    monkeypatch.setenv("GPUFRAG_CACHE_DIR", str(tmp_path))
    code = main(["--model", "builtin:resnet-small", "--backend", "tensorrt", "--port", "0",
                 "--host", "127.0.0.1", "--log-level", "error"])
    assert code == EXIT_NO_GPU
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("gpufrag serve: the TensorRT backend needs the 'tensorrt' package")
