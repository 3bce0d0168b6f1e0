"""The skip rules (tests/skips.py, judged by tests/conftest.py's hooks) hold where it matters: in a
real pytest run, for skips from a test, a fixture, a mark and a module's collection.

A small suite is written to a temporary folder with a conftest that takes the hooks from
tests/conftest.py and records each test's final outcome; it is run twice in a fresh pytest
process, without and with ``GPUFRAG_STRICT_SKIPS=1``, and with the data root pointed at an empty
folder. On a machine with every prerequisite nothing in the real suite skips, so this is where
the failure paths are seen to work. A static scan keeps every skip in tests/ going through the
named reasons, so one that fires only on some other machine is still a listed one.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpufrag.dataroot import ENV
from tests import skips

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent

_CONFTEST = '''
import json
import os

from tests.conftest import pytest_make_collect_report, pytest_runtest_makereport  # under test

OUTCOMES = {}


def pytest_runtest_logreport(report):
    if report.outcome == "passed" and report.when != "call":
        return
    outcome = "xfailed" if hasattr(report, "wasxfail") else report.outcome
    if OUTCOMES.get(report.nodeid, ("passed",))[0] == "passed":
        OUTCOMES[report.nodeid] = (outcome, str(report.longrepr))


def pytest_collectreport(report):
    if report.outcome != "passed":
        OUTCOMES[report.nodeid] = ("collect " + report.outcome, str(report.longrepr))


def pytest_sessionfinish(session):
    with open(os.environ["OUTCOMES_FILE"], "w") as f:
        json.dump(OUTCOMES, f)
'''

_CASES = '''
import pytest

from tests import skips
from tests.data import trace, trace_or_none


def test_passes():
    pass


def test_unknown_reason():
    pytest.skip("some reason nobody listed")


@pytest.mark.skipif(True, reason="an unlisted mark")
def test_unknown_mark():
    pass


def test_prerequisite():
    skips.skip(skips.NO_GO, "a detail")


@skips.skip_if(True, skips.NOT_ROOT)
def test_prerequisite_mark():
    pass


@pytest.fixture
def needs_a_compiler():
    skips.skip(skips.NO_C_COMPILER)


def test_prerequisite_in_a_fixture(needs_a_compiler):
    pass


def test_by_design():
    skips.skip(skips.NO_GPU)


def test_missing_trace():
    trace("openb", "openb_node_list_gpu_node.csv")


def test_trace_or_none_falls_back():
    assert trace_or_none("genai") is None


@pytest.mark.xfail(strict=True, reason="an expected failure is not a skip")
def test_xfail():
    assert False
'''

_MODULE = '''
from tests import skips

skips.importorskip("gpufrag_no_such_module", skips.NOT_INSTALLED)


def test_never_collected():
    pass
'''

# nodeid: (outcome without the strict switch, outcome with it)
EXPECTED = {
    "test_cases.py::test_passes": ("passed", "passed"),
    "test_cases.py::test_unknown_reason": ("failed", "failed"),
    "test_cases.py::test_unknown_mark": ("failed", "failed"),
    "test_cases.py::test_prerequisite": ("skipped", "failed"),
    "test_cases.py::test_prerequisite_mark": ("skipped", "failed"),
    "test_cases.py::test_prerequisite_in_a_fixture": ("skipped", "failed"),
    "test_cases.py::test_by_design": ("skipped", "skipped"),
    "test_cases.py::test_missing_trace": ("skipped", "failed"),
    "test_cases.py::test_trace_or_none_falls_back": ("passed", "failed"),
    "test_cases.py::test_xfail": ("xfailed", "xfailed"),
    "test_module.py": ("collect skipped", "collect failed"),
}


def _run(folder: Path, strict: bool) -> dict[str, tuple[str, str]]:
    out = folder / f"outcomes-{strict}.json"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_", "GPUFRAG_"))}
    env.update(PYTHONPATH=str(REPO), OUTCOMES_FILE=str(out), **{ENV: str(folder / "no-data")})
    if strict:
        env[skips.STRICT_ENV] = "1"
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:randomly", "-p", "no:cacheprovider",
         "--continue-on-collection-errors", "-q", "-c", str(folder / "pytest.ini"),
         "--rootdir", str(folder), str(folder)],
        cwd=folder, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert out.is_file(), result.stdout + result.stderr
    recorded: dict[str, list[str]] = json.loads(out.read_text())
    return {nodeid: (outcome, text) for nodeid, (outcome, text) in recorded.items()}


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[bool, dict[str, tuple[str, str]]]:
    folder = tmp_path_factory.mktemp("skips")
    (folder / "pytest.ini").write_text("[pytest]\n")
    (folder / "conftest.py").write_text(_CONFTEST)
    (folder / "test_cases.py").write_text(_CASES)
    (folder / "test_module.py").write_text(_MODULE)
    return {strict: _run(folder, strict) for strict in (False, True)}


@pytest.mark.parametrize("strict", [False, True], ids=["plain", "strict"])
def test_every_kind_of_skip_is_judged(outcomes: dict[bool, dict[str, tuple[str, str]]],
                                      strict: bool) -> None:
    got = {nodeid: outcome for nodeid, (outcome, _) in outcomes[strict].items()}
    assert got == {nodeid: pair[strict] for nodeid, pair in EXPECTED.items()}


@pytest.mark.parametrize("strict", [False, True], ids=["plain", "strict"])
def test_an_unlisted_reason_fails_and_says_where_the_list_is(
        outcomes: dict[bool, dict[str, tuple[str, str]]], strict: bool) -> None:
    _, text = outcomes[strict]["test_cases.py::test_unknown_reason"]
    assert "skip reason not in tests/skips.py: 'some reason nobody listed'" in text


def test_the_strict_switch_names_itself_and_the_reason(
        outcomes: dict[bool, dict[str, tuple[str, str]]]) -> None:
    _, text = outcomes[True]["test_cases.py::test_missing_trace"]
    assert f"{skips.STRICT_ENV}=1 makes that a failure" in text and "MISSING_TRACE:" in text
    assert "no-data" in text  # the path looked at


@pytest.mark.parametrize(("message", "strict", "verdict"), [
    ("Skipped: NO_GO: no Go toolchain on PATH", False, None),
    ("NO_GO: no Go toolchain on PATH", True, "GPUFRAG_STRICT_SKIPS=1"),
    ("Skipped: NO_GPU: anything", True, None),
    ("no_go: lower case is another name", False, "not in tests/skips.py"),
    ("NO_GO without the colon", False, "not in tests/skips.py"),
    ("", False, "not in tests/skips.py"),
])
def test_judge(message: str, strict: bool, verdict: str | None,
               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(skips.STRICT_ENV, "1" if strict else "0")
    got = skips.judge(message)
    assert (got is None) if verdict is None else (got is not None and verdict in got)


def test_the_prerequisites_are_what_ci_must_have() -> None:
    assert {r.name for r in skips.REASONS.values() if r.prerequisite} == {
        "MISSING_TRACE", "NOT_ROOT", "NO_GO", "NO_C_COMPILER", "MISSING_COMMAND", "NOT_INSTALLED"}
    assert all(name == r.name and re.fullmatch(r"[A-Z][A-Z_]*", name)
               for name, r in skips.REASONS.items())


# What skipping by hand looks like; the two files that must spell it are left out.
_BY_HAND = re.compile(r"pytest\.(skip\(|importorskip\(|mark\.skip)|from pytest import .*skip"
                      r"|unittest\.skip|raise .*SkipTest")


def test_every_skip_in_the_tests_goes_through_the_named_reasons() -> None:
    found = [f"{path.relative_to(REPO)}:{number}: {line.strip()}"
             for path in sorted(TESTS.rglob("*.py"))
             if path.name not in {"skips.py", "test_skips.py"} or path.parent != TESTS
             for number, line in enumerate(path.read_text().splitlines(), 1)
             if _BY_HAND.search(line)]
    assert found == []
