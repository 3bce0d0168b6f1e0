"""The shared names section: one remap, read the same way by every component."""

from __future__ import annotations

import pytest

from defrag.controller.cli import build_parser as defrag_parser
from defrag.controller.cli import config_from as defrag_config
from gpufrag.conventions import (
    DEFAULT_NAMES,
    NAMES_ENV_PREFIX,
    encode_hint_entries,
    hints_from_configmap,
    names_from_environ,
    names_from_mapping,
)
from gpufrag.errors import BadInput
from scheduler.extender.config import load_config

ALIYUN = {f"{NAMES_ENV_PREFIX}GPU_MILLI": "aliyun.com/gpu-mem",
          f"{NAMES_ENV_PREFIX}HINTS_NAMESPACE": "kube-system"}


def test_defaults_without_environment() -> None:
    assert names_from_environ({}) == DEFAULT_NAMES
    assert DEFAULT_NAMES.problems() == []


def test_environment_remaps_fields() -> None:
    names = names_from_environ({**ALIYUN, "UNRELATED": "x"})
    assert names.gpu_milli == "aliyun.com/gpu-mem"
    assert names.hints_namespace == "kube-system"
    assert names.gpu == DEFAULT_NAMES.gpu


@pytest.mark.parametrize(("env", "field", "message"), [
    ({f"{NAMES_ENV_PREFIX}GPU_MILI": "x"}, f"environment {NAMES_ENV_PREFIX}GPU_MILI",
     "unknown setting"),
    ({f"{NAMES_ENV_PREFIX}GPU": "not a name"}, f"environment {NAMES_ENV_PREFIX}GPU",
     "qualified name"),
    ({f"{NAMES_ENV_PREFIX}HINTS_NAMESPACE": "Bad_NS"},
     f"environment {NAMES_ENV_PREFIX}HINTS_NAMESPACE", "namespace name"),
])
def test_bad_environment_names_the_variable(env: dict[str, str], field: str,
                                            message: str) -> None:
    with pytest.raises(BadInput, match=message) as e:
        names_from_environ(env)
    assert e.value.field == field


def test_mapping_rejects_non_strings() -> None:
    with pytest.raises(BadInput, match="expected a string") as e:
        names_from_mapping({"gpu": 3})
    assert e.value.field == "names.gpu"


def test_one_remap_reaches_the_extender_and_defrag(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in ALIYUN.items():
        monkeypatch.setenv(key, value)
    extender = load_config(environ=ALIYUN)
    defrag = defrag_config(defrag_parser().parse_args([]))
    assert extender.names == defrag.names == names_from_environ(ALIYUN)


def test_extender_settings_win_over_the_shared_section() -> None:
    env = {**ALIYUN, "GPUFRAG_EXTENDER__NAMES__GPU_MILLI": "hami.io/gpu-milli"}
    assert load_config(environ=env).names.gpu_milli == "hami.io/gpu-milli"


def test_hint_encoding_round_trips() -> None:
    entries = [("gpu-1", 1767225600.0), ("gpu-2", 1767225601.5)]
    hints, problems = hints_from_configmap({"data": {"rs-1": encode_hint_entries(entries)}})
    assert problems == []
    assert hints.by_owner["rs-1"] == tuple(entries)
