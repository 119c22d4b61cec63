"""Reading `nvidia-smi topo -m` (samples, layouts, malformed text, arbitrary text), classifying paths
and their expected bandwidth, the pair choice, the reports and NVML's answer without a GPU."""

import itertools
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from labutils.core.inputs import LabInputError
from labutils.readers import topology as tp
from labutils.readers.links import link_figure, pcie_figure
from labutils.readers.topology import GpuFacts, host_link, path_table

SAMPLES = tp.list_samples()

# Hand-made variants of real layouts: header words spaced by tabs or runs of spaces.
TWO_TABS = ("\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
            "GPU0\t X \tPHB\t0-63\t0\t\tN/A\n"
            "GPU1\tPHB\t X \t0-63\t0\t\tN/A\n")
TWO_SPACES = ("        GPU0    GPU1    CPU Affinity    NUMA Affinity\n"
              "GPU0     X      NV4     0-15            0\n"
              "GPU1    NV4      X      0-15            0\n\nLegend:\n\n  X    = Self\n")
OLD_DRIVER = ("$ nvidia-smi topo -m\n\tGPU0\tGPU1\tmlx5_0\tCPU Affinity\n"
              "GPU0\t X \tSOC\tPHB\t0-9,20-29\nGPU1\tSOC\t X \tSOC\t10-19,30-39\nmlx5_0\tPHB\tSOC\t X \t\n")


def _matrix_text(n, code, sep="\t", ansi=False):
    head = sep + sep.join([f"GPU{i}" for i in range(n)] + ["CPU Affinity", "NUMA Affinity"])
    if ansi:
        head = "\x1b[1m\x1b[4m" + head + "\x1b[0m"
    rows = [sep.join([f"GPU{i}"] + [" X " if i == j else code for j in range(n)] + ["0-7", "0"]) for i in range(n)]
    return "\n".join([head] + rows) + "\n"


@pytest.mark.parametrize("name", SAMPLES)
def test_every_sample_parses_into_a_consistent_topology(name):
    topo = tp.load_sample(name)
    n = len(topo.gpus)
    assert 2 <= n <= 16
    assert topo.gpus == tuple(f"GPU{i}" for i in range(n))
    assert len(topo.cpu_affinity) == len(topo.numa_affinity) == len(topo.gpu_numa_id) == n
    assert all(topo.cpu_affinity), "every GPU row carries its CPU affinity"
    for a, b in itertools.product(topo.devices, repeat=2):
        assert (topo.link(a, b) == "X") == (a == b)
        assert topo.link(a, b) == topo.link(b, a)
    assert len(tp.pair_paths(topo)) == n * (n - 1) // 2
    assert name in set(tp.sample_facts().name), "each sample has a row in samples.csv"


def test_required_samples_are_shipped():
    codes = {name: {p.code for p in tp.pair_paths(tp.load_sample(name))} for name in SAMPLES}
    assert any(c == {"SYS"} for c in codes.values())
    assert any(c == {"PHB"} for c in codes.values())
    assert any(c == {"NV4"} for c in codes.values())
    assert codes["eight_gpu_nvswitch_dgx_h100"] == {"NV18"}
    assert {"PIX", "PXB", "NODE", "SYS"} <= codes["eight_gpu_pcie_switches"]
    assert len(tp.load_sample("sixteen_gpu_nvswitch_dgx2").gpus) == 16
    assert len(tp.load_sample("eight_gpu_nvswitch_dgx_h100").nics) == 10
    assert (tp.SAMPLES_DIR / "README.md").exists()


def test_tabs_with_empty_cells():
    topo = tp.parse_topology(TWO_TABS)
    assert topo.link(0, 1) == "PHB"
    assert topo.cpu_affinity == ("0-63", "0-63")
    assert topo.numa_affinity == ("0", "0")
    assert topo.gpu_numa_id == (None, None)
    assert topo.attributes == ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")


def test_spaces_legend_and_no_gpu_numa_column():
    topo = tp.parse_topology(TWO_SPACES)
    assert topo.gpu_links() == {"GPU0": {"GPU1": "NV4"}, "GPU1": {"GPU0": "NV4"}}
    assert topo.gpu_numa_id == (None, None)


def test_ansi_codes_and_sixteen_gpus_are_read():
    topo = tp.parse_topology(_matrix_text(16, "NV12", sep="   ", ansi=True))
    assert len(topo.gpus) == 16 and topo.link(3, 15) == "NV12"
    assert tp.strip_ansi("\x1b[4mGPU0\x1b[0m") == "GPU0"


def test_old_driver_nic_columns_soc_and_preamble():
    topo = tp.parse_topology(OLD_DRIVER)
    assert topo.nics == ("mlx5_0",)
    assert topo.link("GPU0", "mlx5_0") == "PHB"
    assert topo.numa_affinity == (None, None)
    assert tp.pair_path(topo, 0, 1).path_class == tp.classify("SYS")[1]


def test_nic_rows_and_legend():
    topo = tp.load_sample("eight_gpu_nvswitch_dgx_h100")
    assert topo.nic_name("NIC3") == "mlx5_3"
    assert topo.link("GPU0", "NIC3") == "PIX"
    assert tp.summary(topo)["nics"]["NIC9"] == "mlx5_9"


def test_missing_nic_rows_are_read_from_columns():
    text = "\tGPU0\tGPU1\tNIC0\tCPU Affinity\nGPU0\t X \tPIX\tPIX\t0-3\nGPU1\tPIX\t X \tPXB\t0-3\n"
    topo = tp.parse_topology(text)
    assert topo.link("NIC0", "GPU1") == "PXB"


@pytest.mark.parametrize("text, line_no, words", [
    ("hello\nworld\n", None, "no header line"),
    (TWO_TABS.replace("PHB\t X", "FOO\t X"), 3, "unknown link code 'FOO'"),
    (TWO_TABS.replace("GPU1\tPHB\t X \t0-63\t0\t\tN/A", "GPU1\tPHB"), 3, "1 link cell(s)"),
    (TWO_TABS.replace("GPU1\tPHB\t X \t0-63\t0\t\tN/A", "GPU7\tPHB\t X "), 3, "row 'GPU7'"),
    (TWO_TABS.replace("GPU1\tPHB\t X \t0-63\t0\t\tN/A\n", ""), 3, "ends before the row(s) of ['GPU1']"),
    (TWO_TABS.replace("GPU1\tPHB\t X", "GPU1\tSYS\t X"), 3, "must be symmetric"),
    (TWO_TABS.replace("GPU0\t X \tPHB", "GPU0\tPHB\tPHB"), 2, "against itself"),
    (TWO_TABS.replace("\t0-63\t0\t\tN/A\nGPU1", "\t0-63\t0\tN/A\t7\t8\nGPU1"), 2, "after the link columns"),
    ("\tGPU1\tGPU0\nGPU1\t X \tPHB\nGPU0\tPHB\t X \n", 1, "in order"),
    ("\tGPU0\tGPU1\tBogus Column\nGPU0\t X \tPHB\nGPU1\tPHB\t X \n", 1, "header column"),
])
def test_malformed_text_names_the_line(text, line_no, words):
    with pytest.raises(tp.TopologyParseError) as info:
        tp.parse_topology(text)
    assert words in str(info.value)
    assert info.value.line_no == line_no
    if line_no is not None:
        assert f"line {line_no}:" in str(info.value)
    assert isinstance(info.value, LabInputError)


def test_classification_orders_paths_fastest_first():
    ranks = [tp.classify(c)[0] for c in ("NV2", "PIX", "PXB", "PHB", "NODE", "SYS")]
    assert ranks == sorted(ranks, reverse=True)
    assert tp.classify("NV18")[0] > tp.classify("NV4")[0]
    assert tp.classify("NV18")[3] == 18
    assert tp.classify("SOC") == tp.classify("SYS")
    assert all(tp.classify(c)[2] for c in tp.PATHS)
    with pytest.raises(LabInputError):
        tp.classify("X")


def test_expected_ranges_come_from_the_table():
    pix = tp.expected_figure("PIX", 4)
    assert (pix.low_GBps, pix.high_GBps) == (pcie_figure(4).low_GBps, pcie_figure(4).high_GBps)
    assert tp.expected_figure("NV18").name == "NVLink 4 (H100 SXM)"
    sys5 = tp.expected_figure("SYS", 5)
    assert sys5.low_GBps == pytest.approx(link_figure("PCIe 5.0 x16 across sockets (SYS)").low_GBps)
    assert sys5.high_GBps == pcie_figure(5).low_GBps  # the article: 22 measured against ~50 clean
    sys3 = tp.expected_figure("SYS", 3)
    assert sys3.low_GBps == pytest.approx(15.75 * 22 / 63, abs=0.01)  # the article's share of the spec
    for code in ("PIX", "PXB", "PHB", "NODE", "SYS", "NV4", "NV7"):
        fig = tp.expected_figure(code)
        assert 0 < fig.low_GBps <= fig.high_GBps


def test_each_pcie_path_has_its_own_sourced_expectation():
    """PIX/PXB go peer-to-peer at the wire's rate; PHB/NODE go through host memory by default
    (NCCL's default), at the wire's rate only where peer-to-peer is on; SYS is the article's
    measured 22 of ~50."""
    p2p = {code: tp.expected_figure(code, 5, p2p=True) for code in ("PIX", "PXB", "PHB", "NODE")}
    assert {(f.low_GBps, f.high_GBps) for f in p2p.values()} == {(50, 63)}
    assert len({f.name for f in p2p.values()}) == 4 and p2p["PXB"].path_class == "PXB"
    assert "INTEL_P2P_OVERHEAD" in p2p["PHB"].source and "paths.cc" in p2p["PIX"].source
    assert "NODE and PHB are the same path" in p2p["NODE"].source
    host = tp.expected_figure("PHB", 5)  # unknown peer access: NCCL's default, no P2P beyond PXB
    assert "through host memory" in host.name and (host.low_GBps, host.high_GBps) == (25, 50)
    assert tp.path_route("PHB") == tp.path_route("NODE") == tp.path_route("SYS") == "through host memory"
    assert tp.path_route("PIX") == tp.path_route("PXB") == "peer-to-peer" and tp.path_route("NV12") == "NVLink"
    assert tp.path_route("PIX", p2p=False) == "through host memory"
    assert "through host memory" in tp.expected_figure("PIX", 5, p2p=False).name
    sys = tp.expected_figure("SYS", 5)
    assert "22" in sys.source and sys.high_GBps == 50
    assert sys == tp.expected_figure("SYS", 5, p2p=True), "one SYS band whatever the route"
    assert "peer-to-peer" not in sys.name and "host memory" not in sys.name, "the SYS band names no route"
    # a narrower link carries width/16 of the figures
    narrow = tp.expected_figure("PIX", 4, width=8)
    assert (narrow.low_GBps, narrow.high_GBps) == (12, 15.75) and "x8" in narrow.name
    path = tp.pair_path(tp.load_sample("two_gpu_phb"), 0, 1, 4)
    assert path.route == "through host memory" and "host memory" in path.description


def test_pair_choice_prefers_the_fastest_path_and_names_the_slowest():
    topo = tp.load_sample("eight_gpu_pcie_switches")
    pick = tp.choose_pair(topo)
    assert (pick.best.a, pick.best.b, pick.best.code) == ("GPU0", "GPU1", "PIX")
    assert pick.worst.code == "SYS" and "Avoid" in pick.reason
    assert tp.choose_pair(topo, among=[2, 3, 6]).best.code == "PXB"
    assert tp.group_bottleneck(topo, [0, 1, 2, 3]).code == "NODE"
    assert tp.group_bottleneck(topo, [0, 1, 4, 5]).code == "SYS"
    assert tp.group_bottleneck(tp.load_sample("eight_gpu_nvswitch_dgx_h100"), range(8)).code == "NV18"
    with pytest.raises(LabInputError):
        tp.choose_pair(topo, among=[1])
    with pytest.raises(LabInputError):
        tp.choose_pair(topo, among=[0, 9])


def test_summary_json_shape():
    out = tp.summary(tp.load_sample("two_gpu_phb"), pcie_gen=4)
    assert out["gpus"] == ["GPU0", "GPU1"]
    assert out["links"] == {"GPU0": {"GPU1": "PHB"}, "GPU1": {"GPU0": "PHB"}}
    assert out["cpu_affinity"] == {"GPU0": "0-15", "GPU1": "0-15"}
    pair = out["pairs"][0]
    assert pair["class"] == "through the host bridge" and pair["route"] == "through host memory"
    assert (pair["expected_low_GBps"], pair["expected_high_GBps"]) == (12, 25)  # no P2P beyond PXB: via host
    assert out["best_pair"]["gpus"] == ["GPU0", "GPU1"]
    text = tp.describe(tp.load_sample("two_gpu_phb"))
    assert "GPU0-GPU1" in text and "PHB" in text


def test_single_gpu_output_has_no_pairs():
    text = "\x1b[4m\tGPU0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\nGPU0\t X \t0-15\t0\t\tN/A\n\nLegend:\n"
    topo = tp.parse_topology(text)
    assert topo.gpus == ("GPU0",) and tp.pair_paths(topo) == []
    out = tp.summary(topo)
    assert "best_pair" not in out and out["cpu_affinity"] == {"GPU0": "0-15"}
    assert "1 GPU(s)" in tp.describe(topo)


def test_nvml_answers_without_a_gpu():
    facts, why = tp.nvml_facts()
    assert facts or why, "no facts come with the reason why"
    assert tp.pcie_gen_of([]) == tp.DEFAULT_PCIE_GEN


# --- arbitrary text (property tests) ---

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=400))
def test_topology_reader_raises_only_lab_input_error(text):
    try:
        topo = tp.parse_topology(text)
    except LabInputError:
        return
    assert all(len(row) == len(topo.devices) for row in topo.matrix)


CELLS = st.sampled_from(["X", "NV1", "NV12", "NV0", "NV99999999999999999999", "PIX", "PXB", "PHB", "NODE", "SYS",
                         "SOC", "QPI", "N/A", "0-23", "\x1b[4m"])


@FAST
@given(st.integers(1, 5), st.lists(st.lists(CELLS, max_size=7), max_size=6))
def test_topology_reader_on_matrix_shaped_junk(n, rows):
    text = "\t" + "\t".join(f"GPU{i}" for i in range(n)) + "\tCPU Affinity\n"
    text += "\n".join(f"GPU{i}\t" + "\t".join(r) for i, r in enumerate(rows)) + "\n"
    try:
        topo = tp.parse_topology(text)
    except LabInputError:
        return
    assert len(topo.gpus) == n and all(topo.matrix[i][i] == "X" for i in range(n))


def test_host_link_uses_the_links_maximum_and_says_when_it_idles(h200):
    link = host_link(h200)
    assert (link.gen, link.width, link.label) == (5, 16, "PCIe 5.0 x16")
    assert "gen 1" in link.note and "under load" in link.note
    assert host_link(None).gen == 4 and "assumed" in host_link(None).note
    narrow = host_link(GpuFacts(0, "x", 4, 4, 8, 8, 0))
    assert (narrow.gen, narrow.width, narrow.note) == (4, 8, "")
    assert host_link(GpuFacts(0, "x", 6, 6, 16, 16, 0)).gen == 6  # PCIe 6 is known (pcie.pcie_band)
    odd = host_link(GpuFacts(0, "x", None, None, 6, 6, 0))
    assert (odd.gen, odd.width) == (4, 4) and "no PCIe generation" in odd.note


def test_path_table_gives_each_code_its_route_and_figures():
    table = path_table(5)
    assert list(table.index) == ["NV#", "PIX", "PXB", "PHB", "NODE", "SYS"]
    assert table.loc["PIX", "route by default"] == "peer-to-peer"
    amd = "through host memory; peer-to-peer on an AMD CPU with 2 GPUs"
    assert set(table.loc[["PHB", "NODE", "SYS"], "route by default"]) == {amd}
    assert (table.loc["SYS", "low_GBps"], table.loc["SYS", "high_GBps"]) == (22, 50)
    assert table["source"].str.len().min() > 20
    assert path_table(4).loc["PIX", "high_GBps"] == 31.5


@pytest.mark.parametrize("env, cpu, n, level", [
    ({}, "Intel", 2, "PXB"), ({}, "AMD", 2, "SYS"), ({}, "AuthenticAMD", 2, "SYS"), ({}, "AMD", 3, "PXB"),
    ({}, None, 2, None), ({}, "AMD", None, None),
    ({"NCCL_P2P_LEVEL": "phb"}, None, None, "PHB"), ({"NCCL_P2P_LEVEL": "3"}, "AMD", 2, "PHB"),
    ({"NCCL_P2P_LEVEL": "9"}, None, None, "SYS"),
    ({"NCCL_P2P_DISABLE": "1", "NCCL_P2P_LEVEL": "SYS"}, None, None, "LOC"),
    ({"NCCL_P2P_DISABLE": "0"}, "Intel", 8, "PXB"),
])
def test_nccl_p2p_level_follows_paths_cc(env, cpu, n, level):
    """ncclTopoCheckP2p: PXB by default, SYS on AMD with at most two GPUs, NCCL_P2P_LEVEL replaces it
    (names or legacy integers 0-5), NCCL_P2P_DISABLE=1 is LOC."""
    assert tp.nccl_p2p_level(cpu, n, env) == level


def test_nccl_route_needs_the_level_and_the_drivers_peer_access():
    assert tp.nccl_route("PIX", True) == tp.nccl_route("PXB", True, "Intel", 8) == "peer-to-peer"
    assert tp.nccl_route("PIX", False) == "through host memory", "the driver offers no peer access (GeForce)"
    assert tp.nccl_route("SYS", True, "Intel", 2) == tp.nccl_route("NODE", True, "AMD", 8) == "through host memory"
    assert tp.nccl_route("SYS", True, "AMD", 2) == tp.nccl_route("PHB", True, "AMD", 2) == "peer-to-peer"
    assert tp.nccl_route("SYS", False, "AMD", 2) == "through host memory"
    assert tp.nccl_route("SYS", True) == "peer-to-peer or through host memory", "the CPU decides"
    assert tp.nccl_route("PIX", None) == "peer-to-peer or through host memory", "the driver decides"
    assert tp.nccl_route("PHB", True, "Intel", 2, {"NCCL_P2P_LEVEL": "SYS"}) == "peer-to-peer"
    assert tp.nccl_route("NV4", True, env={"NCCL_P2P_DISABLE": "1"}) == "through host memory"
    assert tp.nccl_route("NV18", True) == "NVLink"
    assert tp.nccl_level_of("NODE") == "PHB" and tp.nccl_level_of("SOC") == "SYS"
    table = tp.path_table(5)
    assert table.loc["PXB", "route by default"] == "peer-to-peer"
    assert table.loc["SYS", "route by default"].startswith("through host memory; peer-to-peer on an AMD CPU")


def test_describe_without_pairs_prints_no_pick():
    topo = tp.load_sample("eight_gpu_pcie_switches")
    assert "For a 2-GPU job" in tp.describe(topo, 4) and "GPU0-GPU1" in tp.describe(topo, 4)
    short = tp.describe(topo, 4, pairs=False)
    assert "For a 2-GPU job" not in short and "GPU0-GPU1" not in short and "NUMA node" in short


# --- the corpus: matrices people pasted in public threads, recreated (data/topologies/corpus/README.md) ---

CORPUS = tp.SAMPLES_DIR / "corpus"
# file -> (GPUs, NICs, the codes between GPUs)
MATRICES = {
    "two_gpu_phb_tabs_empty_cell.txt": (2, 0, {"PHB"}),
    "two_gpu_node_markdown_indented.txt": (2, 0, {"NODE"}),
    "five_gpu_sys_phb_node.txt": (5, 0, {"SYS", "PHB", "NODE"}),
    "eight_gpu_sys_pix_ten_nics.txt": (8, 10, {"SYS"}),
    "eight_gpu_nv12_twelve_nics_dgx_a100.txt": (8, 12, {"NV12"}),
    "four_gpu_gb200_numa_lists.txt": (4, 6, {"NV18"}),
    "eight_gpu_b200_one_off_nvlink.txt": (8, 0, {"NV18", "NODE", "SYS"}),
    "eight_gpu_nv8_nine_nics_no_gpu_numa_id.txt": (8, 9, {"NV8"}),
}
# refused layouts: file -> the words of the one line, which names the bad column or code
REFUSED = {
    "refused_abbreviated_dots.txt": "header column '...' is not a device name",
    "refused_quoted_gt.txt": "header column '>>>' is not a device name",
    "refused_renamed_columns.txt": "header column(s) 'CPU cores NUMA node' after the devices are not nvidia-smi's",
    "refused_p2p_status_matrix.txt": "unknown link code 'GNS' in row GPU0, column GPU1",
}


def test_every_corpus_matrix_is_tested_and_has_its_provenance():
    readme = (CORPUS / "README.md").read_text(encoding="utf-8")
    assert sorted(p.name for p in CORPUS.glob("*.txt")) == sorted({**MATRICES, **REFUSED})
    for name in {**MATRICES, **REFUSED}:
        row = next(line for line in readme.splitlines() if line.startswith(f"| `{name}`"))
        assert "https://" in row.split("|")[2], f"{name}: the README names the thread it comes from"


@pytest.mark.parametrize("name", sorted(MATRICES))
def test_each_corpus_matrix_is_read(name):
    gpus, nics, codes = MATRICES[name]
    topo = tp.read_topology_file(CORPUS / name)
    assert (len(topo.gpus), len(topo.nics)) == (gpus, nics)
    assert {p.code for p in tp.pair_paths(topo)} == codes
    assert all(topo.cpu_affinity)


def test_gb200_numa_lists_and_gpu_numa_ids_and_the_nic_legend():
    topo = tp.read_topology_file(CORPUS / "four_gpu_gb200_numa_lists.txt")
    assert topo.numa_affinity[0] == "0,2-8,10-16" and topo.gpu_numa_id == ("2", "10", "18", "26")
    assert topo.nic_name("NIC5") == "mlx5_5"
    dgx = tp.read_topology_file(CORPUS / "eight_gpu_nv12_twelve_nics_dgx_a100.txt")
    assert dgx.numa_affinity == ("3", "3", "1", "1", "7", "7", "5", "5") and dgx.link("GPU0", "NIC1") == "PXB"


def test_one_gpu_off_nvlink_is_the_bottleneck_of_the_eight():
    topo = tp.read_topology_file(CORPUS / "eight_gpu_b200_one_off_nvlink.txt")
    assert tp.group_bottleneck(topo, range(8)).code == "SYS"
    assert tp.group_bottleneck(topo, [0, 1, 3, 4]).code == "NV18"


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_abbreviated_quoted_renamed_or_wrong_matrices_are_refused_naming_the_column(name, capsys):
    from labutils.cli import main

    with pytest.raises(tp.TopologyParseError, match=re.escape(REFUSED[name])):
        tp.read_topology_file(CORPUS / name)
    assert main(["topo", "--file", str(CORPUS / name)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and REFUSED[name] in err
    if "p2p" in name:
        assert "topo -p2p" in err


def test_more_gpus_than_a_machine_holds_is_one_line_naming_the_count():
    with pytest.raises(tp.TopologyParseError, match="the header names 1000 GPUs, more than one machine's"):
        tp.parse_topology(_matrix_text(1000, "SYS"))  # refused from its header, before any cell is read
    assert tp.MAX_GPUS == 64


def test_a_64_gpu_matrix_is_classified_quickly():
    """Each pair's expected figure is computed once per code (the link table is not re-read per pair)."""
    topo = tp.parse_topology(_matrix_text(64, "NV18"))
    assert len(tp.pair_paths(topo)) == 64 * 63 // 2
    assert tp.describe(topo) and tp.summary(topo)["best_pair"]["code"] == "NV18"
    assert tp.expected_figure("SYS", 4) is tp.expected_figure("SYS", 4)


def test_a_whole_float_generation_is_that_generation():
    from labutils.readers.topology import expected_figure

    assert expected_figure("PIX", 4.0) == expected_figure("PIX", 4)
    assert expected_figure("SYS", 4.0).name == "SYS across sockets (PCIe 4.0 x16)"
    with pytest.raises(LabInputError, match="pcie_gen=4.5"):
        expected_figure("PIX", 4.5)
