"""The nccl-tests format: the parser on every layout (current, old 2.x, launcher prefixes, INFO lines,
-J JSON), the world size however the log is cut, the table printed back, and a reader that raises
nothing but LabInputError on arbitrary text."""

import json
import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from labutils.cli import main
from labutils.core.busbw import bus_factor
from labutils.core.inputs import LabInputError
from labutils.readers.nccl_tests import parse_json, parse_nccl_tests, parse_text

SAMPLES = Path(__file__).resolve().parent.parent / "data" / "nccl_tests"
REQUIRED = {"size_bytes", "count", "dtype", "op", "time_us", "algbw_GBps", "busbw_GBps", "wrong", "world_size",
            "backend", "in_place"}

NEW = """\
# nccl-tests version 2.16.4 nccl-headers=22603 nccl-library=22603
# Collective test starting: all_reduce_perf
#  Rank  0 Group  0 Pid   1710 on  box device  0 [0000:07:00] NVIDIA A100-SXM4-80GB
#  Rank  1 Group  0 Pid   1711 on  box device  1 [0000:0a:00] NVIDIA A100-SXM4-80GB
#
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)  (GB/s)
     1048576        262144     float     sum      -1    16330    0.06    0.06      0    16.10   65.13   65.13      0
box:1710:1722 [0] NCCL INFO Channel 02/0 : 0[7000] -> 1[a000] via P2P/CUMEM
  1073741824     268435456     float     sum      -1  1.2e+05    8.95    8.95    N/A  11775.0   91.19   91.19      2
# Out of bounds values : 1 FAILED
# Avg bus bandwidth    : 41.3325
"""


def test_current_layout_numbers_na_and_stray_lines():
    log = parse_text(NEW)
    f = log.frame
    assert log.meta["op"] == "all_reduce" and log.meta["world_size"] == 2
    assert list(f["size_bytes"]) == [1048576, 1048576, 1073741824, 1073741824]
    assert list(f["in_place"]) == [False, True, False, True]
    assert list(f["time_us"]) == [16330.0, 16.10, 1.2e5, 11775.0]
    assert math.isnan(f["wrong"].iloc[2]) and f["wrong"].iloc[3] == 2
    assert log.meta["avg_busbw_GBps"] == pytest.approx(41.3325) and log.meta["out_of_bounds"] == 1
    assert set(f["dtype"]) == {"float32"} and set(f["root"]) == {-1}


OLD_ALL_GATHER = """\
#   Rank  0 Pid  20211 on  pcie-box device  0 [0x03] Tesla P100-PCIE-16GB
#   Rank  1 Pid  20211 on  pcie-box device  1 [0x04] Tesla P100-PCIE-16GB
#   Rank  2 Pid  20211 on  pcie-box device  2 [0x05] Tesla P100-PCIE-16GB
#         size         count    type     time   algbw   busbw  error     time   algbw   busbw  error
#          (B)    (elements)             (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
       3145728        262144   float    583.1    5.39    3.60  0e+00    580.4    5.42    3.61  0e+00
 Out of bounds values : 0 OK
 Avg bus bandwidth    : 3.605
"""


def test_old_layout_without_redop_or_root_keeps_the_error_apart():
    log = parse_text(OLD_ALL_GATHER, op="all_gather")
    f = log.frame
    assert log.meta["world_size"] == 3 and log.meta["avg_busbw_GBps"] == pytest.approx(3.605)
    assert list(f["redop"]) == ["none", "none"] and f["root"].isna().all()  # the log has no root column
    assert f["wrong"].isna().all() and (f["max_error"] == 0).all()
    assert list(f["busbw_GBps"]) == [3.60, 3.61]


def test_headerless_rows_with_launcher_prefixes_are_guessed():
    text = ("[1,0]<stdout>:     1048576        262144     float     sum      -1    66.87   15.68   15.68      0"
            "    67.84   15.46   15.46      0\n"
            "0:        8192          2048     float     sum    37.07    0.22    0.41  5e-07"
            "    35.50    0.23    0.43  5e-07\n")
    f = parse_text(text, op="all_reduce").frame
    assert list(f["size_bytes"]) == [1048576, 1048576, 8192, 8192]
    assert list(f["root"][:2]) == [-1, -1] and f["root"][2:].isna().all()  # the second row has no root
    assert list(f["busbw_GBps"]) == [15.68, 15.46, 0.41, 0.43]


def test_info_output_glued_inside_a_row():
    header = ("#       size         count      type   redop    root     time   algbw   busbw #wrong"
              "     time   algbw   busbw #wrong\n")
    text = (header + "           8             2     float     sum      -1"
            "3f9a2c1d7e55:41822:41836 [0] NCCL INFO Channel 00/0 : x\n"
            "3f9a2c1d7e55:41822:41837 [1] NCCL INFO Connected all rings\n"
            "    19.52    0.00    0.00      0    19.37    0.00    0.00      0\n"
            "          16             4     float     sum      -1    19.03    0.00    0.00      0"
            "    19.47    0.00    0.00      0\n")
    f = parse_text(text, op="all_reduce").frame
    assert list(f["size_bytes"]) == [8, 8, 16, 16]
    assert list(f["root"]) == [-1, -1, -1, -1]
    assert list(f["time_us"]) == [19.52, 19.37, 19.03, 19.47]
    lost = (header + "          32             8     float     sum      -1host:1:2 [0] NCCL WARN gave up\n"
            + text.splitlines()[-1])
    assert list(parse_text(lost, op="all_reduce").frame["size_bytes"]) == [16, 16]  # the next row still counts


def test_per_iteration_layout_reads_the_main_columns():
    # The layout as nccl-tests prints it (printf style, hence the noqa).
    text = ("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %7s  %7s  %7s"  # noqa: UP031
            "  %7s  %6s  %6s  %6s  %7s  %7s  %7s  %7s\n"
            % ("size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "i_min", "i_max", "i_p99",
               "i_cv%", "time", "algbw", "busbw", "#wrong", "i_min", "i_max", "i_p99", "i_cv%"))
    text += ("     4194304       1048576     float     sum      -1   208.53   20.11   20.11       0"
             "   201.0   230.1   229.0     2.1   210.00   19.97   19.97       0   203.0   231.0   230.0     2.3\n")
    f = parse_text(text, op="all_reduce").frame
    assert list(f["time_us"]) == [208.53, 210.00] and list(f["busbw_GBps"]) == [20.11, 19.97]


@pytest.mark.parametrize("name, op, world, rows", [
    ("sample_all_reduce_2x5090_sys.log", "all_reduce", 2, 52),
    ("sample_all_reduce_old_layout.log", "all_reduce", 4, 34),
    ("sample_all_gather_2nodes_srun.log", "all_gather", 2, 16),
    ("sample_all_reduce_2x5090_sys.json", "all_reduce", 2, 18),
])
def test_shipped_samples(name, op, world, rows):
    log = parse_nccl_tests(SAMPLES / name)
    assert log.meta["op"] == op and log.meta["world_size"] == world and len(log.frame) == rows
    assert REQUIRED <= set(log.frame.columns)
    assert log.frame["in_place"].sum() == rows // 2
    big = log.frame[log.frame["size_bytes"] == log.frame["size_bytes"].max()]
    if "5090" in name:  # the article's ~22 GB/s across sockets
        assert big["busbw_GBps"].between(20, 24).all()
    algbw = log.frame["size_bytes"] / log.frame["time_us"] / 1e3
    sizeable = log.frame["algbw_GBps"] > 1
    assert (abs(algbw[sizeable] / log.frame["algbw_GBps"][sizeable] - 1) < 0.02).all()


def test_json_report_variants():
    doc = {"version": 2, "args": ["/opt/nccl-tests/build/reduce_scatter_perf", "-J", "x.json"],
           "config": {"devices": [{"device_info": "GPU"}] * 4},
           "results": [{"size": 4096, "count": 512, "type": "bfloat16", "redop": "sum", "root": "    -1",
                        "out_of_place": None,
                        "in_place": {"cpu_time": 30.5, "alg_bw": 0.134295, "bus_bw": 0.100721, "nwrong": None}}],
           "average_bus_bandwidth": {"bandwidth": 0.1, "okay": "unchecked"}}
    log = parse_json(doc)
    f = log.frame
    assert log.meta["op"] == "reduce_scatter" and log.meta["world_size"] == 4
    assert len(f) == 1 and bool(f["in_place"].iloc[0]) and f["dtype"].iloc[0] == "bfloat16"
    assert f["time_us"].iloc[0] == 30.5 and f["algbw_GBps"].iloc[0] == 0.134295 and math.isnan(f["wrong"].iloc[0])
    doc["results"][0]["in_place"]["alg_bw"] = "nan"  # what -J writes for NaN: no run prints it
    with pytest.raises(LabInputError, match=r"algbw is not a number .*results\[0\]"):
        parse_json(doc)


def test_bad_inputs_are_one_line_errors(tmp_path):
    with pytest.raises(LabInputError, match="no nccl-tests result rows"):
        parse_text("hello\n# nothing here\n")
    cut = tmp_path / "cut.json"
    cut.write_text('{"version": 2, "results": [{"size": 8,')
    with pytest.raises(LabInputError, match="cut short"):
        parse_nccl_tests(cut)
    with pytest.raises(LabInputError, match="does not exist"):
        parse_nccl_tests(tmp_path / "missing.log")


def test_cli_json_csv_and_exit_codes(capsys, tmp_path):
    assert main(["parse-nccl-tests", str(SAMPLES / "sample_all_reduce_2x5090_sys.log"), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 52 and all(REQUIRED <= set(r) for r in rows)
    assert {r["in_place"] for r in rows} == {True, False} and rows[0]["world_size"] == 2
    assert main(["parse-nccl-tests", str(SAMPLES / "sample_all_gather_2nodes_srun.log"), "--csv"]) == 0
    assert capsys.readouterr().out.splitlines()[0].startswith("op,size_bytes,count,dtype")
    assert main(["parse-nccl-tests", str(SAMPLES / "sample_all_reduce_old_layout.log")]) == 0
    assert "# Avg bus bandwidth" in capsys.readouterr().out
    assert main(["parse-nccl-tests", str(tmp_path / "nope.log")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and len(err.splitlines()) == 1


# --- the world size and arbitrary text (property tests) ---

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
HEAD = ("#       size         count      type   redop    root     time   algbw   busbw #wrong"
        "     time   algbw   busbw #wrong")


def nccl_log(n: int, ranks=None, header: bool = True, sizes=(1 << 20, 1 << 24, 1 << 26)) -> str:
    """An all_reduce_perf log of `n` ranks; `ranks` limits the # Rank lines kept (a cut log)."""
    lines = ["# all_reduce_perf"]
    if header:
        lines.append(f"# nThread 1 nGpus {n} minBytes 8 maxBytes 67108864 step: 2(factor) warmup iters: 5 iters: 20")
    for r in (range(n) if ranks is None else ranks):
        lines.append(f"#  Rank {r:2d} Group  0 Pid  4182 on host device {r:2d} [0x{r:02x}] NVIDIA H100")
    lines.append(HEAD)
    for size in sizes:
        t = 5.0 + size / 2e4
        alg = size / t / 1e3
        bus = alg * bus_factor("all_reduce", n)
        lines.append(f"{size:12d}  {size // 4:12d}     float     sum      -1  {t:7.2f}  {alg:6.2f}  {bus:6.2f}      0"
                     f"  {t:7.2f}  {alg:6.2f}  {bus:6.2f}      0")
    lines.append("# Avg bus bandwidth    : 12.3456 ")
    return "\n".join(lines) + "\n"


def test_a_log_cut_to_its_tail_keeps_its_world_size():
    cut = nccl_log(8, ranks=[0, 1])  # the case: two # Rank lines survive, the header says 8
    log = parse_text(cut)
    assert log.meta["world_size"] == 8 and "nGpus 8" in log.meta["world_size_source"]
    assert log.meta["bus_factor"] == pytest.approx(1.75)
    headless = parse_text(nccl_log(8, ranks=[6, 7], header=False))
    assert headless.meta["world_size"] == 8 and headless.meta["world_size_source"].startswith("busbw/algbw")
    assert parse_text(nccl_log(8, ranks=[], header=False), nranks=8).meta["world_size"] == 8


def test_rank_lines_from_0_are_not_the_world_when_the_numbers_say_more():
    """A headless log cut to rank 0's line: busbw/algbw says many ranks, so the answer is unknown,
    never 1 (hypothesis found n = 30); a complete headless log keeps its count."""
    cut = parse_text(nccl_log(30, ranks=[0], header=False))
    assert cut.meta["world_size"] == 30 and cut.meta["world_size_source"].startswith("busbw/algbw")
    few = parse_text(nccl_log(30, ranks=[0], header=False, sizes=(1 << 10,)))  # 2 decimals of tiny numbers
    assert few.meta["world_size"] is None and "--nranks" in few.meta["world_size_source"]
    assert parse_text(nccl_log(2, ranks=[0, 1], header=False)).meta["world_size"] == 2


def test_sources_that_disagree_are_refused_and_nranks_must_agree():
    with pytest.raises(LabInputError, match="disagrees"):
        parse_text(nccl_log(8).replace("nGpus 8", "nGpus 2"))
    with pytest.raises(LabInputError, match="--nranks says 4"):
        parse_text(nccl_log(8), nranks=4)
    with pytest.raises(LabInputError, match="Rank line for rank 7"):
        parse_text(nccl_log(4, ranks=[0, 7]))


def test_the_log_own_avg_line_is_quoted_and_old_layouts_get_no_root(capsys):
    assert main(["parse-nccl-tests", "data/nccl_tests/sample_all_reduce_old_layout.log"]) == 0
    out = capsys.readouterr().out
    assert "# Avg bus bandwidth    : 5.3301" in out and "root" not in out
    assert main(["parse-nccl-tests", "data/nccl_tests/sample_all_reduce_2x5090_sys.log"]) == 0
    assert "Avg bus bandwidth    : 8.34782" in capsys.readouterr().out


@FAST
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=400))
def test_nccl_tests_reader_raises_only_lab_input_error(text):
    try:
        log = parse_text(text)
    except LabInputError:
        return
    world = log.meta["world_size"]
    assert world is None or (isinstance(world, int) and world >= 1)
    assert log.frame["world_size"].nunique(dropna=False) == 1


ROW_PIECES = st.sampled_from(["#", "# nThread 1 nGpus 4", "#  Rank  3 Group 0 Pid 1 on h device 3 [0x1] G",
                              HEAD, "   1024   256   float   sum   -1   5.0   0.20   0.30   0   5.0   0.20   0.30   0",
                              "   2048   512   float   sum   -1", "   7.0   0.29   0.44   0", "nan", "N/A", "-1",
                              "1e999", "h:1:2 [0] NCCL INFO comm 0x1 rank 0 nranks 4 cudaDev 0", "{", "0: ", "\t"])


@FAST
@given(st.lists(ROW_PIECES, max_size=12), st.lists(st.text(max_size=20), max_size=3))
def test_nccl_tests_reader_on_log_shaped_junk(pieces, noise):
    try:
        log = parse_text("\n".join(pieces + noise))
    except LabInputError:
        return
    assert log.meta["world_size"] in (None, 4) or log.meta["world_size"] >= 1


@FAST
@given(st.integers(min_value=2, max_value=72), st.data())
def test_world_size_is_right_however_the_log_is_cut(n, data):
    kept = data.draw(st.lists(st.integers(0, n - 1), unique=True, max_size=n).map(sorted))
    header = data.draw(st.booleans())
    log = parse_text(nccl_log(n, ranks=kept, header=header))
    assert log.meta["world_size"] in (n, None)
    if header:
        assert log.meta["world_size"] == n


# --- the corpus: layouts seen in public threads (data/nccl_tests/README.md names each thread) ---

CORPUS = SAMPLES / "corpus"
EXPECTED = json.loads((CORPUS / "expected.json").read_text())


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_corpus_layout(name):
    e = EXPECTED[name]
    op = None if e["op_named"] else e["op"]  # an excerpt without its command line needs --op
    log = parse_nccl_tests(CORPUS / name, op=op)
    f = log.frame
    assert log.meta["op"] == e["op"] and log.meta["world_size"] == e["world_size"]
    if e.get("nranks"):
        assert parse_nccl_tests(CORPUS / name, op=op, nranks=e["nranks"]).meta["world_size"] == e["nranks"]
    halves = [h for _, hs in e["rows"] for h in hs]
    assert len(f) == len(halves)
    assert list(f["size_bytes"][~f["in_place"]]) == [size for size, _ in e["rows"]]
    got = [v for t in zip(f["time_us"], f["algbw_GBps"], f["busbw_GBps"]) for v in t]
    assert got == pytest.approx([v for h in halves for v in h])
    assert list(f["in_place"]) == [k == 1 for _, hs in e["rows"] for k in range(len(hs))]


def test_corpus_has_thirty_layouts():
    assert len(EXPECTED) >= 30


def test_corpus_special_cases():
    blank = parse_nccl_tests(CORPUS / "06_old_alltoall_blank_redop.log", op="alltoall").frame
    assert set(blank["redop"]) == {"none"} and list(blank["max_error"]) == [0, 1, 0, 1]
    alone = parse_nccl_tests(CORPUS / "03_mpirun_without_mpi_build.log").meta
    assert alone["independent_runs"] == 2 and "MPI=1" in alone["world_size_source"]
    assert parse_nccl_tests(CORPUS / "14_multiline_mpirun_g8_256ranks.log").frame["wrong"].isna().all()
    assert parse_nccl_tests(CORPUS / "13_srun_all_reduce_perf_mpi.log").meta["program"] == "all_reduce_perf_mpi"


# --- logs no run could print are refused, naming the row ---

ROW = ("     1048576        262144     float     sum      -1    66.87   15.68   15.68      0"
       "    67.84   15.46   15.46      0")


def two_ranks(row: str = ROW) -> str:
    return ("# nThread 1 nGpus 2 minBytes 8 maxBytes 8 step: 2(factor) warmup iters: 5 iters: 20\n" + HEAD + "\n"
            + row + "\n")


@pytest.mark.parametrize("bad, needle", [
    (ROW.replace("66.87", "  inf"), "time="),
    (ROW.replace("66.87", "  nan"), "time is not a number"),
    (ROW.replace("66.87", " 0.00"), "time=0"),
    (ROW.replace("   1048576", "1" + "0" * 30, 1), "size="),
    (ROW.replace("262144", "262145"), "count=262145 does not match"),
    (ROW.replace("15.68   15.68", "156.8   156.8", 1), "algbw=156.8"),
    (ROW.replace("15.68   15.68", "15.68   47.04", 1), "busbw=47.04"),
    (ROW.replace("15.68   15.68", "15.68   19.60", 1), "busbw=19.6 .* bus factor of all_reduce on 2"),
])
def test_rows_no_run_prints_are_refused_naming_the_row(bad, needle):
    with pytest.raises(LabInputError, match=needle) as err:
        parse_text(two_ranks(bad), op="all_reduce", nranks=2)
    assert "nccl-tests row at line" in str(err.value)


def test_rounding_and_absurd_headers():
    assert len(parse_text(two_ranks(ROW.replace("66.87", "66.88"))).frame) == 2  # 15.678 prints as 15.68
    with pytest.raises(LabInputError, match="algbw=15.69"):  # 15.6806 never prints as 15.69
        parse_text(two_ranks(ROW.replace("15.68   15.68", "15.69   15.69", 1)))
    with pytest.raises(LabInputError, match="nGpus 99999999"):
        parse_text(two_ranks().replace("nGpus 2", "nGpus 99999999"))


def test_a_long_file_of_junk_is_refused_after_its_first_lines():
    """Refused once 100,000 lines held no header, rank line, program name or row: the rest is never
    parsed (benchmarks/reader_speed.py times a 200 MB file)."""
    with pytest.raises(LabInputError, match="first 100000 lines"):
        parse_text("1 2 float 3 4 5\n" * 100_001)
