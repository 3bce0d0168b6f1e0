"""Every bad trace file is bad input: the openb readers return data or raise ``BadInput`` naming
the file (and the row and field where there is one), never another exception; ``gpufrag whatif``
turns that into one stderr line and exit code 2. Generated files first, then each known case."""

from __future__ import annotations

import itertools
import tracemalloc
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufrag.cli import main
from gpufrag.errors import BadInput
from scheduler.core.types import MAX_GPUS_PER_NODE, MILLI_PER_GPU, NodeSpec, PodRequest
from simulations import openb
from simulations.openb import MAX_AMOUNT, MAX_LINE_BYTES, load_nodes, load_pods
from tests.simulations.test_openb import NODES, PODS

NODE_HEADER = "sn,cpu_milli,memory_mib,gpu,model"
POD_HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos"
PRODUCTS = {"T4", "V100M16"}
CLI_PODS = PODS.replace("T4|V100M16", "T4")  # the CLI's cluster (NODES) has only T4

# Values a hand-edited or machine-written trace plausibly holds where a number belongs.
JUNK = ["", " ", "-1", "-0", "0.9", "1.5", "470.5", "1e400", "-1e400", "1e-400", "10^30",
        "9223372036854775808", "18446744073709551616", "9" * 400, "nan", "NaN", "inf", "-inf",
        "Infinity", "1_000", "１２", "0x10", "1,000", "1e99999999999999999999", "1e3", "1000.0",
        "+5", ".5", "5.", "e5", "--1", "\x00", '"', "T4", "\ufeff1", "1 2"]

junk_numbers = st.one_of(st.sampled_from(JUNK), st.integers(-(2**70), 2**70).map(str),
                        st.floats(allow_nan=True, allow_infinity=True).map(repr))
junk_text = st.one_of(st.sampled_from(["", "n0", "p0", "pod-3", "A100", "T4||", "T4|V100M16"]),
                      st.text(max_size=8))


def _rarely(draw: st.DrawFn, good: str, junk: st.SearchStrategy[str]) -> str:
    """``good`` most of the time, junk one time in eight: mostly-valid files reach the checks
    behind the first field (and some load), instead of all failing on row 2."""
    return draw(junk) if draw(st.integers(0, 7)) == 0 else good


def _node_row(draw: st.DrawFn, i: int) -> list[str]:
    gpus = draw(st.sampled_from([0, 1, 2, 4, 8]))
    return [_rarely(draw, f"n{i}", junk_text),
            _rarely(draw, str(draw(st.integers(0, 128_000))), junk_numbers),
            _rarely(draw, str(draw(st.integers(0, 10**6))), junk_numbers),
            _rarely(draw, str(gpus), junk_numbers),
            _rarely(draw, draw(st.sampled_from(["T4", "V100M16"])) if gpus else "", junk_text)]


def _pod_row(draw: st.DrawFn, i: int) -> list[str]:
    num_gpu, gpu_milli = draw(st.sampled_from([(0, 0), (1, 470), (1, 1000), (2, 1000),
                                               (8, 1000)]))
    return [_rarely(draw, f"p{i}", junk_text),
            _rarely(draw, str(draw(st.integers(0, 128_000))), junk_numbers),
            _rarely(draw, str(draw(st.integers(0, 10**6))), junk_numbers),
            _rarely(draw, str(num_gpu), junk_numbers),
            _rarely(draw, str(gpu_milli), junk_numbers),
            _rarely(draw, draw(st.sampled_from(["", "T4", "T4|V100M16"])), junk_text), "LS"]


def _one_in(draw: st.DrawFn, n: int) -> bool:
    return draw(st.integers(0, n - 1)) == 0


def _encode(header: str, rows: list[list[str]], draw: st.DrawFn) -> bytes:
    """Rows as CSV bytes, with the framing mutations files really carry: fields dropped or
    added, a BOM, CRLF or lone CR, blank lines, quoting, cut short, random bytes spliced in."""
    lines = [header]
    for row in rows:
        if _one_in(draw, 12):
            row.pop(draw(st.integers(0, len(row) - 1)))
        elif _one_in(draw, 12):
            row.append(draw(junk_numbers))
        lines.append(",".join(f'"{v}"' if '"' not in v and _one_in(draw, 4) else v for v in row))
        if _one_in(draw, 10):
            lines.append("")
    end = draw(st.sampled_from(["\n"] * 4 + ["\r\n"] * 3 + ["\r"]))
    data = end.join(lines).encode("utf-8", "surrogatepass") + end.encode()
    if _one_in(draw, 4):
        data = b"\xef\xbb\xbf" + data
    if _one_in(draw, 6):
        at = draw(st.integers(0, len(data)))
        data = data[:at] + draw(st.binary(min_size=1, max_size=16)) + data[at:]
    if _one_in(draw, 20):
        data = data[: draw(st.integers(0, len(data)))]
    return data


@st.composite
def node_files(draw: st.DrawFn) -> bytes:
    rows = [_node_row(draw, i) for i in range(draw(st.integers(0, 6)))]
    return _encode(NODE_HEADER, rows, draw)


@st.composite
def pod_files(draw: st.DrawFn) -> bytes:
    rows = [_pod_row(draw, i) for i in range(draw(st.integers(0, 6)))]
    return _encode(POD_HEADER, rows, draw)


def _check_nodes(nodes: Sequence[NodeSpec]) -> None:
    assert nodes and len({n.name for n in nodes}) == len(nodes)
    for n in nodes:
        assert 0 <= n.cpu_milli <= MAX_AMOUNT and 0 <= n.memory_mib <= MAX_AMOUNT
        assert 0 <= n.gpu_count <= MAX_GPUS_PER_NODE and bool(n.gpu_product) == bool(n.gpu_count)


def _check_pods(pods: Sequence[PodRequest]) -> None:
    assert pods and len({p.name for p in pods}) == len(pods)
    for p in pods:
        assert 0 <= p.cpu_milli <= MAX_AMOUNT and 0 <= p.memory_mib <= MAX_AMOUNT
        assert (p.num_gpu == 0) == (p.gpu_milli == 0) and p.gpu_milli <= MILLI_PER_GPU
        assert p.gpu_spec <= PRODUCTS


def _load_or_bad_input(path: Path, data: bytes, load: Callable[[Path], object]) -> object:
    path.write_bytes(data)
    try:
        return load(path)
    except BadInput as exc:
        assert exc.source == str(path), exc
        assert "\n" not in str(exc) and "\r" not in str(exc)
        return exc


FUZZ = settings(max_examples=300, deadline=1000,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])


@FUZZ
@given(data=node_files())
def test_generated_node_files_load_or_are_bad_input(tmp_path: Path, data: bytes) -> None:
    result = _load_or_bad_input(tmp_path / "nodes.csv", data, load_nodes)
    if not isinstance(result, BadInput):
        assert isinstance(result, list)
        _check_nodes(result)


@FUZZ
@given(data=pod_files())
def test_generated_pod_files_load_or_are_bad_input(tmp_path: Path, data: bytes) -> None:
    result = _load_or_bad_input(tmp_path / "pods.csv", data,
                                lambda p: load_pods(p, PRODUCTS))
    if not isinstance(result, BadInput):
        assert isinstance(result, list)
        _check_pods(result)


@settings(max_examples=200, deadline=1000,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=512))
def test_random_bytes_are_data_or_bad_input(tmp_path: Path, data: bytes) -> None:
    _load_or_bad_input(tmp_path / "nodes.csv", data, load_nodes)
    _load_or_bad_input(tmp_path / "pods.csv", data, load_pods)


# --- each known case, by name -------------------------------------------------------------

def write(tmp_path: Path, name: str, data: str | bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return path


def pod_file(*rows: str) -> str:
    return POD_HEADER + "\n" + "".join(r + "\n" for r in rows)


BAD_POD_FILES: list[tuple[str, str, str]] = [
    ("duplicate pod name", pod_file("p0,1,1,1,470,,LS", "p0,1,1,0,0,,LS"),
     r"row 3, field 'name': duplicate pod name 'p0' \(first on row 2\)"),
    ("generated name clashes", pod_file("pod-3,1,1,0,0,,LS", ",1,1,0,0,,LS"),
     r"row 3, field 'name': duplicate pod name 'pod-3'"),
    ("1e400", pod_file("p0,1e400,1,0,0,,LS"), r"row 2, field 'cpu_milli': 1e400 outside 0\.\."),
    ("-1e400", pod_file("p0,1,-1e400,0,0,,LS"), r"field 'memory_mib': -1e400 outside"),
    ("10^30", pod_file("p0,10^30,1,0,0,,LS"), r"field 'cpu_milli': not a number: '10\^30'"),
    ("nan", pod_file("p0,nan,1,0,0,,LS"), r"field 'cpu_milli': not a number: 'nan'"),
    ("inf", pod_file("p0,1,inf,0,0,,LS"), r"field 'memory_mib': not a number: 'inf'"),
    ("huge exponent", pod_file("p0,1e99999999999999999999,1,0,0,,LS"),
     r"field 'cpu_milli': .*exponent out of range"),
    ("past int64", pod_file("p0,9223372036854775808,1,0,0,,LS"),
     r"field 'cpu_milli': 9223372036854775808 outside 0\.\.1000000000000"),
    ("400 digits", pod_file("p0," + "9" * 400 + ",1,0,0,,LS"), r"field 'cpu_milli': 9{40}\.\.\."),
    ("negative", pod_file("p0,-5,1,0,0,,LS"), r"row 2, field 'cpu_milli': -5 outside"),
    ("negative GPUs", pod_file("p0,1,1,-1,1000,,LS"), r"field 'num_gpu': -1 outside 0\.\.16"),
    ("0.9 GPUs", pod_file("p0,1,1,0.9,1000,,LS"),
     r"row 2, field 'num_gpu': 0\.9 is not a whole GPU count.*num_gpu 1, gpu_milli 900"),
    ("1.5 GPUs", pod_file("p0,1,1,1.5,1000,,LS"), r"field 'num_gpu': 1\.5 is not a whole GPU"),
    ("fractional milli", pod_file("p0,1,1,1,470.5,,LS"),
     r"field 'gpu_milli': 470\.5 is not a whole number"),
    ("fractional cpu", pod_file("p0,0.5,1,0,0,,LS"), r"field 'cpu_milli': 0\.5 is not a whole"),
    ("share on a CPU pod", pod_file("p0,1,1,0,470,,LS"),
     r"field 'gpu_milli': gpu_milli 470 with num_gpu 0"),
    ("empty file", "", r"row 1: no header"),
    ("blank first line", "\n" + pod_file("p0,1,1,0,0,,LS"), r"row 1: no header"),
    ("header only", POD_HEADER + "\n", r"row 2: no pods"),
    ("missing column", "name,cpu_milli,memory_mib,num_gpu\np0,1,1,0\n",
     r"row 1: missing column\(s\) gpu_milli"),
    ("doubled column", "name,cpu_milli,memory_mib,num_gpu,gpu_milli,name\n",
     r"row 1: column\(s\) name appear more than once"),
    ("extra field in a row", pod_file("p0,1,1,0,0,,LS,extra"), r"row 2: expected 7 fields, got 8"),
    ("missing field in a row", pod_file("p0,1,1,0,0"), r"row 2: expected 7 fields, got 5"),
    ("lone CR line ends", pod_file("p0,1,1,0,0,,LS").replace("\n", "\r"), r"lone CR"),
]


@pytest.mark.parametrize(("case", "text", "message"), BAD_POD_FILES,
                         ids=[c[0] for c in BAD_POD_FILES])
def test_bad_pod_files(tmp_path: Path, case: str, text: str, message: str) -> None:
    path = write(tmp_path, "p.csv", text)
    with pytest.raises(BadInput, match=message) as caught:
        load_pods(path, PRODUCTS)
    assert caught.value.source == str(path)


def test_duplicate_node_name_names_the_first_row(tmp_path: Path) -> None:
    path = write(tmp_path, "n.csv", NODES + "n0,1,1,1,T4\n")
    with pytest.raises(BadInput, match=r"row 4, field 'sn': duplicate node name 'n0' \(first on "
                                       r"row 2\)"):
        load_nodes(path)


def test_node_numbers_are_checked_like_pod_numbers(tmp_path: Path) -> None:
    for value, message in [("1e400", "outside"), ("nan", "not a number"), ("2.5", "whole")]:
        path = write(tmp_path, "n.csv", NODES + f"n2,1,1,{value},T4\n")
        with pytest.raises(BadInput, match=f"row 4, field 'gpu': .*{message}"):
            load_nodes(path)


def test_whole_numbers_in_other_spellings_load(tmp_path: Path) -> None:
    pods = load_pods(write(tmp_path, "p.csv", pod_file("p0,1e3,1000.0,1,+470,,LS")))
    assert (pods[0].cpu_milli, pods[0].memory_mib, pods[0].gpu_milli) == (1000, 1000, 470)


def test_extra_columns_in_any_order_are_ignored(tmp_path: Path) -> None:
    text = "qos,gpu_milli,name,extra,num_gpu,memory_mib,cpu_milli\nLS,470,p0,x,1,2048,1000\n"
    pods = load_pods(write(tmp_path, "p.csv", text))
    assert (pods[0].name, pods[0].num_gpu, pods[0].gpu_milli) == ("p0", 1, 470)


def test_bom_crlf_and_blank_lines_load(tmp_path: Path) -> None:
    data = b"\xef\xbb\xbf" + PODS.replace("\n", "\r\n").encode() + b"\r\n\r\n"
    assert len(load_pods(write(tmp_path, "p.csv", data))) == 3
    data = b"\xef\xbb\xbf" + NODES.replace("\n", "\r\n").encode()
    assert [n.name for n in load_nodes(write(tmp_path, "n.csv", data))] == ["n0", "n1"]


def test_non_utf8_names_the_row(tmp_path: Path) -> None:
    # The bad byte is on row 5, well inside the first read buffer: still reported at row 5.
    data = PODS.encode() + b"p\xe93,1,1,0,0,,LS\n" + b"p4,1,1,0,0,,LS\n" * 1000
    with pytest.raises(BadInput, match=r"p\.csv, row 5: not UTF-8 text"):
        load_pods(write(tmp_path, "p.csv", data))


def test_utf16_is_refused_at_row_1(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match=r"row 1: not UTF-8 text"):
        load_nodes(write(tmp_path, "n.csv", NODES.encode("utf-16")))


def test_directory_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match=r"cannot read: Is a directory") as caught:
        load_nodes(tmp_path)
    assert caught.value.source == str(tmp_path)
    with pytest.raises(BadInput, match=r"missing\.csv: cannot read: No such file"):
        load_pods(tmp_path / "missing.csv")


def _peak_bytes_until_bad_input(action: Callable[[], object]) -> int:
    """Peak Python memory while ``action`` runs into its ``BadInput``."""
    tracemalloc.start()
    try:
        with pytest.raises(BadInput):
            action()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_50_mb_header_fails_fast_in_bounded_memory(tmp_path: Path) -> None:
    path = tmp_path / "n.csv"
    with path.open("wb") as handle:
        handle.write(b"sn,cpu_milli,memory_mib,gpu,model,")
        chunk = b"x" * (1 << 20)
        for _ in range(50):
            handle.write(chunk)
        handle.write(b"\n")
    with pytest.raises(BadInput, match=rf"n\.csv, row 1: row longer than {MAX_LINE_BYTES} bytes"):
        load_nodes(path)
    assert _peak_bytes_until_bad_input(lambda: load_nodes(path)) < 2 * 1024 * 1024


def test_a_long_line_inside_the_file_names_its_row(tmp_path: Path) -> None:
    text = PODS + "p3," + "9" * (2 * MAX_LINE_BYTES) + ",1,0,0,,LS\n"
    with pytest.raises(BadInput, match=r"row 5: row longer than"):
        load_pods(write(tmp_path, "p.csv", text))


def test_a_quoted_field_over_many_short_lines_is_bounded_too(tmp_path: Path) -> None:
    path = write(tmp_path, "p.csv", POD_HEADER + '\n"p0' + "\n" * (4 * MAX_LINE_BYTES) + '"\n')
    with pytest.raises(BadInput, match=r"row 2: row longer than"):
        load_pods(path)
    assert _peak_bytes_until_bad_input(lambda: load_pods(path)) < 2 * 1024 * 1024


def test_row_count_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(openb, "MAX_ROWS", 2)
    with pytest.raises(BadInput, match=r"row 4: more than 2 rows"):
        load_pods(write(tmp_path, "p.csv", PODS))


def test_every_row_and_field_in_a_pod_row_is_checked(tmp_path: Path) -> None:
    """Junk in each number column of each row is caught at that row and that column."""
    columns = ["cpu_milli", "memory_mib", "num_gpu", "gpu_milli"]
    for row, (col, junk) in itertools.product(range(3), itertools.product(range(4),
                                                                           ["x", "1e400"])):
        lines = PODS.splitlines()
        fields = lines[row + 1].split(",")
        fields[col + 1] = junk
        lines[row + 1] = ",".join(fields)
        path = write(tmp_path, "p.csv", "\n".join(lines) + "\n")
        with pytest.raises(BadInput, match=rf"row {row + 2}, field '{columns[col]}'"):
            load_pods(path, PRODUCTS)


# --- through the command ------------------------------------------------------------------

def run_whatif(tmp_path: Path, capsys: pytest.CaptureFixture[str], *, nodes: str | bytes = NODES,
               pods: str | bytes = CLI_PODS) -> tuple[int, str]:
    n = write(tmp_path, "n.csv", nodes)
    p = write(tmp_path, "p.csv", pods)
    code = main(["whatif", "--nodes", str(n), "--pods", str(p), "--out", str(tmp_path / "o"),
                 "--no-plots", "--jobs", "1", "--policies", "fgd"])
    return code, capsys.readouterr().err


CLI_CASES: list[tuple[str, dict[str, str | bytes], str]] = [
    ("duplicate pods", {"pods": pod_file("p0,1,1,1,470,,LS", "p0,1,1,1,470,,LS")},
     "p.csv, row 3, field 'name': duplicate pod name"),
    ("duplicate nodes", {"nodes": NODES + "n1,1,1,0,\n"}, "n.csv, row 4, field 'sn': duplicate"),
    ("1e400", {"pods": pod_file("p0,1e400,1,1,470,,LS")}, "p.csv, row 2, field 'cpu_milli'"),
    ("nan", {"nodes": NODES + "n2,nan,1,0,\n"}, "n.csv, row 4, field 'cpu_milli'"),
    ("0.9 GPUs", {"pods": pod_file("p0,1,1,0.9,1000,,LS")}, "p.csv, row 2, field 'num_gpu'"),
    ("huge header", {"nodes": "sn," + "x" * (2 * MAX_LINE_BYTES) + "\n"},
     "n.csv, row 1: row longer than"),
    ("non-UTF-8", {"pods": CLI_PODS.encode() + b"\xff\n"}, "p.csv, row 5: not UTF-8"),
    ("header only", {"pods": POD_HEADER + "\n"}, "p.csv, row 2: no pods"),
]


@pytest.mark.parametrize(("case", "files", "message"), CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_whatif_bad_files_exit_2_with_one_line(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str], case: str,
                                               files: dict[str, str | bytes], message: str
                                               ) -> None:
    code, err = run_whatif(tmp_path, capsys, **files)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and message in err and "Traceback" not in err


def test_whatif_directory_as_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                          ) -> None:
    write(tmp_path, "p.csv", PODS)
    code = main(["whatif", "--nodes", str(tmp_path), "--pods", str(tmp_path / "p.csv"),
                 "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "cannot read: Is a directory" in err


def test_whatif_refuses_a_trace_that_needs_millions_of_resamples(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 2 GPUs x 1.3 = 2,600 milli from 1-milli pods: fine. 16 nodes x 16 GPUs x 10: not fine.
    nodes = NODE_HEADER + "\n" + "".join(f"n{i},1,1,16,T4\n" for i in range(16))
    write(tmp_path, "n.csv", nodes)
    write(tmp_path, "p.csv", pod_file("p0,1,1,1,1,,LS"))
    code = main(["whatif", "--nodes", str(tmp_path / "n.csv"), "--pods", str(tmp_path / "p.csv"),
                 "--tune", "10", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "needs about 2560000 pods" in err
