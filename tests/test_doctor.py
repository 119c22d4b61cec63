"""The doctor: bands at the links' current generation and width, each cause rule and its ranking,
the shipped cases, the JSON contract, bad input (one line, exit 2, nothing started),
the live path with its readings faked, and the planted-fault exercise checker."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from labutils import cli
from labutils.core.inputs import LabInputError
from labutils.core.results import save_result
from labutils.doctor import cases, evidence, live, rules
from labutils.doctor import doctor as dr
from labutils.readers import pcie
from labutils.readers.topology import GpuFacts, expected_figure, load_sample, parse_topology, read_topology_file
from tests.test_pcie import TWO_ROOTS

ROOT = Path(__file__).resolve().parent.parent
DOCTOR = ROOT / "data" / "doctor"
SAMPLE_LOG = ROOT / "data" / "nccl_tests" / "sample_all_reduce_2x5090_sys.log"
CASES = [c["name"] for c in cases.load_cases()]


def facts(n, name="NVIDIA L40S", gen=4, width=16, nvlinks=0, p2p=None, **change):
    """MachineFacts of `n` like GPUs; change={i: {"pcie_gen": 3}} plants a fault on GPU i."""
    rows = []
    for i in range(n):
        row = dict(index=i, name=name, pcie_gen=gen, pcie_gen_max=gen, pcie_width=width, pcie_width_max=width,
                   nvlinks_active=nvlinks)
        row.update(change.get("change", {}).get(i, {}))
        if p2p is not None:
            row["p2p"] = [i == j or p2p for j in range(n)]
        rows.append(row)
    return evidence.parse_facts(rows, "test")


def busbw(x):
    return evidence.measurement_from_busbw(x)


def run_cli(capsys, *args):
    code = cli.main(["doctor", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


# ---- bands ------------------------------------------------------------------------------------

@pytest.mark.parametrize("gen", [3, 4, 5])
@pytest.mark.parametrize("code", ["PIX", "PXB", "PHB", "NODE", "SYS", "NV4", "NV18"])
def test_path_band_at_x16_is_the_topology_figure(code, gen):
    """The doctor's band is the topology's peer-to-peer figure (no P2P is a cause, not a band)."""
    mine, theirs = evidence.path_band(code, gen, 16), expected_figure(code, gen, p2p=True)
    assert (mine.low_GBps, mine.high_GBps) == pytest.approx((theirs.low_GBps, theirs.high_GBps))


def test_path_band_scales_with_width():
    assert evidence.path_band("SYS", 4, 8).high_GBps == pytest.approx(evidence.path_band("SYS", 4, 16).high_GBps / 2)


# ---- the shipped cases --------------------------------------------------------------------------

@pytest.mark.parametrize("name", CASES)
def test_every_shipped_case_finds_what_it_plants(name):
    case = next(c for c in cases.load_cases() if c["name"] == name)
    d = dr.doctor_case(name)
    assert case["plants"] in d.cause_ids, dr.format_diagnosis(d)
    assert d.verdict == case["verdict"]
    assert set(d.cause_ids) <= set(rules.CAUSE_IDS)
    assert all(c.evidence and c.fix for c in d.causes)


def test_every_cause_is_planted_by_a_case_and_documented():
    planted = {c["plants"] for c in cases.load_cases()}
    assert planted == set(rules.CAUSE_IDS)
    readme = (DOCTOR / "README.md").read_text(encoding="utf-8")
    for c in cases.load_cases():
        assert f"`{c['name']}`" in readme
        for key in ("facts", "lspci", "sweep"):
            if c.get(key):
                assert (ROOT / c[key]).is_file()
                assert Path(c[key]).name in readme


def test_case_table_and_facts_table():
    table = dr.case_table()
    assert "exercise_downtrained" not in table.index and len(table) == len(CASES) - 1
    assert table.loc["cross_socket", "verdict"] == "as expected"
    assert table.loc["gloo_backend", "first cause"] == "gloo_backend"
    shown = dr.facts_table(evidence.read_facts(DOCTOR / "facts_8xl40s_gpu1_gen3.json"))
    assert list(shown.columns[:2]) == ["name", "pcie_gen"] and shown.loc[1, "pcie_gen"] == 3


def test_case_command_reproduces_the_case(capsys, monkeypatch):
    for name in ("p2p_disabled_by_env", "acs_enabled"):
        command = cases.case_command(name).split()
        env = {k: v for k, v in (t.split("=", 1) for t in command if "=" in t and t.startswith("NCCL_"))}
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        args = command[command.index("doctor") + 1:]
        monkeypatch.chdir(ROOT)
        code, out, _ = run_cli(capsys, *args, "--json")
        assert code == 0 and json.loads(out)["causes"][0]["id"] == name
        for k in env:
            monkeypatch.delenv(k)


# ---- cross-socket: the article's 22 GB/s -------------------------------------------------------------

def test_sys_22_on_pcie5_is_as_expected_not_a_fault():
    d = dr.diagnose(load_sample("two_gpu_sys"), facts=facts(2, gen=5, p2p=True), measurement=busbw(22))
    assert d.verdict == rules.AS_EXPECTED
    assert d.slowest_path["code"] == "SYS"
    assert d.expected_GBps == pytest.approx((22, 50))
    assert d.fraction == pytest.approx(22 / 50)
    assert d.cause_ids[0] == "cross_socket"
    assert "NUMA node 0" in d.causes[0].evidence and "NUMA node 1" in d.causes[0].evidence
    assert d.causes[0].fix.startswith("Accept it")


def test_cross_socket_fix_names_a_pair_on_one_socket():
    topo = load_sample("eight_gpu_pcie_switches")
    d = dr.diagnose(topo, (0, 4), facts(8, p2p=True), measurement=busbw(11))
    assert d.verdict == rules.AS_EXPECTED and d.cause_ids[0] == "cross_socket"
    assert "GPU0, GPU1 (slowest path PIX" in d.causes[0].fix
    four = dr.diagnose(topo, (0, 1, 4, 5), facts(8, p2p=True))
    assert "GPU0, GPU1, GPU2, GPU3" in four.cause("cross_socket").fix


def test_the_article_log_is_read_with_its_transport():
    m = evidence.read_nccl_tests(SAMPLE_LOG)
    assert m.busbw_GBps == pytest.approx(22.16) and m.world_size == 2 and m.backend == "nccl"
    assert m.transports == ("SHM",)
    assert m.peak_size_bytes > m.crossover_bytes
    d = dr.doctor_case("cross_socket")
    assert d.cause_ids[:2] == ("cross_socket", "no_p2p")
    assert "via SHM" in d.cause("no_p2p").evidence and d.cause("no_p2p").shown


# ---- links trained below their maximum ----------------------------------------------------------

def test_downtrained_generation_names_the_gpu_and_both_figures():
    topo = load_sample("eight_gpu_pcie_switches")
    sick = facts(8, p2p=True, change={1: {"pcie_gen": 3}})
    d = dr.diagnose(topo, (0, 1), sick, measurement=busbw(12.6))
    assert d.expected_GBps == (pcie.pcie_band(3).low_GBps, pcie.pcie_band(3).high_GBps)
    assert d.verdict == rules.AS_EXPECTED and d.cause_ids[0] == "pcie_gen_downtrained"
    ev = d.causes[0].evidence
    assert "GPU1" in ev and "gen 3" in ev and "gen 4" in ev and "GPU0" not in ev
    assert "15.75" in ev and "31.5" in ev and "50%" in ev
    healthy = dr.diagnose(topo, (0, 1), facts(8, p2p=True), measurement=busbw(12.6))
    assert healthy.verdict == rules.BELOW and "pcie_gen_downtrained" not in healthy.cause_ids


def test_narrow_width_names_the_gpu_and_both_widths():
    topo = load_sample("eight_gpu_pcie_switches")
    d = dr.diagnose(topo, (2, 3), facts(8, p2p=True, change={3: {"pcie_width": 8}}), measurement=busbw(12.1))
    assert d.expected_GBps[1] == pytest.approx(31.5 / 2)
    assert d.cause_ids[0] == "pcie_width_narrow"
    assert "GPU3" in d.causes[0].evidence and "x8" in d.causes[0].evidence and "x16" in d.causes[0].evidence


def test_a_link_read_while_idle_is_not_called_downtrained():
    topo = load_sample("two_gpu_phb")
    idle = facts(2, p2p=True, change={0: {"pcie_gen": 1}, 1: {"pcie_gen": 1}})
    measured = dr.diagnose(topo, facts=idle, measurement=busbw(25))
    assert measured.verdict == rules.AS_EXPECTED and measured.expected_GBps[1] == 31.5
    assert "pcie_gen_downtrained" not in measured.cause_ids
    assert any("idled" in n for n in measured.notes)
    unmeasured = dr.diagnose(topo, facts=idle)
    assert unmeasured.cause_ids == ("pcie_gen_downtrained",)
    assert "under load" in unmeasured.causes[0].fix


# ---- ACS, peer-to-peer, the environment, NVLink -------------------------------------------------------

TWO_PHB = "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\nGPU0\t X \tPHB\t0-31\t0\nGPU1\tPHB\t X \t0-31\t0\n"


def test_acs_is_reported_only_above_the_group_and_from_the_acsctl_line():
    topo, pci = parse_topology(TWO_PHB), pcie.parse_lspci(TWO_ROOTS)
    d = dr.diagnose(topo, facts=facts(2, p2p=True), pci=pci, measurement=busbw(9))
    acs = d.cause("acs_enabled")
    assert acs is not None and "0000:00:03.1" in acs.evidence and "ReqRedir+" in acs.evidence
    assert "0000:00:01.1" not in acs.evidence
    big = dr.doctor_case("acs_enabled")
    assert big.cause_ids[0] == "acs_enabled" and "the PIX path of the matrix is not the path" in big.causes[0].evidence
    clean = dr.diagnose(load_sample("two_gpu_sys"), facts=facts(2, gen=5, p2p=True),
                        pci=pcie.read_lspci_file(DOCTOR / "lspci_2x5090_sys.txt"), measurement=busbw(22))
    assert "acs_enabled" not in clean.cause_ids


def test_lspci_alone_gives_the_link_state():
    d = dr.diagnose(parse_topology(TWO_PHB), pci=pcie.parse_lspci(TWO_ROOTS), measurement=busbw(6))
    assert d.expected_GBps == (pcie.pcie_band(3, 8).low_GBps, pcie.pcie_band(3, 8).high_GBps)
    assert {"pcie_gen_downtrained", "pcie_width_narrow"} <= set(d.cause_ids)
    assert "GPU0" in d.cause("pcie_width_narrow").evidence


def test_no_p2p_from_the_matrix_the_log_or_the_name():
    topo = load_sample("two_gpu_phb")
    shown = dr.diagnose(topo, facts=facts(2, name="NVIDIA GeForce RTX 4090", p2p=False), measurement=busbw(11))
    assert shown.verdict == rules.BELOW and shown.cause_ids[0] == "no_p2p" and shown.causes[0].shown
    assert "SHM" in shown.causes[0].evidence and "GPU0-GPU1" in shown.causes[0].evidence
    guessed = dr.diagnose(topo, facts=facts(2, name="NVIDIA GeForce RTX 4090"), measurement=busbw(11))
    assert guessed.cause("no_p2p") is not None and not guessed.cause("no_p2p").shown
    assert "Inferred" in guessed.cause("no_p2p").evidence
    datacenter = dr.diagnose(topo, facts=facts(2), measurement=busbw(11))
    assert "no_p2p" not in datacenter.cause_ids


@pytest.mark.parametrize("env, named", [({"NCCL_P2P_DISABLE": "1"}, "NCCL_P2P_DISABLE=1"),
                                        ({"NCCL_P2P_LEVEL": "PIX"}, "NCCL_P2P_LEVEL=PIX"),
                                        ({"NCCL_P2P_LEVEL": "1"}, "NCCL_P2P_LEVEL=1")])
def test_nccl_variables_that_block_p2p_are_named(env, named):
    d = dr.diagnose(load_sample("two_gpu_phb"), facts=facts(2, p2p=True), env={**env, "HOME": "/x"},
                    measurement=busbw(10))
    assert d.cause_ids[0] == "p2p_disabled_by_env" and named in d.causes[0].evidence
    assert f"unset {named.split('=')[0]}" in d.causes[0].fix
    assert any(named in n for n in d.notes) and not any("HOME" in n for n in d.notes)


def test_nccl_variables_that_allow_the_path_are_named_but_not_blamed():
    topo = load_sample("two_gpu_phb")
    d = dr.diagnose(topo, facts=facts(2, name="NVIDIA GeForce RTX 4090", p2p=False),
                    env={"NCCL_P2P_LEVEL": "SYS"}, measurement=busbw(10))
    assert "p2p_disabled_by_env" not in d.cause_ids
    assert "NCCL_P2P_LEVEL=SYS is set but does not block this path" in d.cause("no_p2p").evidence
    shm = dr.diagnose(topo, facts=facts(2, p2p=False), env={"NCCL_SHM_DISABLE": "1"}, measurement=busbw(3))
    assert "NCCL_SHM_DISABLE=1" in shm.cause("p2p_disabled_by_env").evidence
    assert shm.cause_ids[:2] == ("p2p_disabled_by_env", "no_p2p")


def test_nvlink_in_the_matrix_but_not_reached():
    topo = load_sample("two_gpu_nvlink_bridge")
    down = dr.diagnose(topo, facts=facts(2, name="NVIDIA GeForce RTX 3090", nvlinks=4, p2p=True,
                                         change={1: {"nvlinks_active": 0}}), measurement=busbw(9))
    assert down.verdict == rules.BELOW and down.cause_ids[0] == "nvlink_inactive" and down.causes[0].shown
    assert "0 on GPU1" in down.causes[0].evidence and "GPU0" not in down.causes[0].evidence.split(":")[-1]
    unseen = dr.diagnose(topo, facts=facts(2, name="NVIDIA GeForce RTX 3090", nvlinks=4, p2p=True),
                         measurement=busbw(9))
    assert unseen.cause_ids == ("nvlink_inactive",) and not unseen.causes[0].shown
    assert "peer-to-peer disabled" in unseen.causes[0].evidence
    env = dr.diagnose(topo, facts=facts(2, nvlinks=4, p2p=True), env={"NCCL_P2P_DISABLE": "1"}, measurement=busbw(9))
    assert env.cause_ids == ("p2p_disabled_by_env",)
    fine = dr.diagnose(topo, facts=facts(2, nvlinks=4, p2p=True), measurement=busbw(52))
    assert fine.verdict == rules.AS_EXPECTED and fine.causes == ()


def test_above_the_wire_points_at_the_formula_or_nvls():
    d = dr.diagnose(load_sample("eight_gpu_nvswitch_dgx_h100"), facts=facts(8, gen=5, nvlinks=18),
                    measurement=busbw(480))
    assert d.verdict == rules.ABOVE == "above the wire: check the formula or NVLS"
    assert any("NVLS" in n for n in d.notes)


# ---- not a link measurement: gloo, small messages ---------------------------------------------------

def test_a_gloo_sweep_is_not_a_link_measurement():
    d = dr.doctor_case("gloo_backend")
    assert d.cause_ids[0] == "gloo_backend" and d.measured_GBps == pytest.approx(1.7, rel=0.05)
    assert "gloo" in d.causes[0].evidence and "--backend nccl" in d.causes[0].fix


def test_a_peak_below_the_crossover_is_not_a_link_measurement():
    m = evidence.read_sweep(DOCTOR / "sweep_small_2x5090.json")
    assert m.peak_size_bytes == 256 * 1024 and m.crossover_bytes > m.peak_size_bytes
    assert m.fitted_busbw_GBps == pytest.approx(22, rel=0.1)
    d = dr.doctor_case("messages_too_small")
    assert d.cause_ids[0] == "messages_too_small" and "crossover" in d.causes[0].evidence
    assert evidence.read_sweep(DOCTOR / "sweep_small_2x5090.csv").busbw_GBps == m.busbw_GBps
    full = dr.diagnose(load_sample("two_gpu_sys"), facts=facts(2, gen=5, p2p=True),
                       measurement=evidence.read_nccl_tests(SAMPLE_LOG))
    assert "messages_too_small" not in full.cause_ids


def test_without_a_gpu_pair_the_measurement_is_still_judged():
    d = dr.diagnose(None, measurement=evidence.read_sweep(DOCTOR / "sweep_gloo_2x5090.json"))
    assert d.verdict == rules.NO_PAIR and d.slowest_path is None and d.expected_GBps is None
    assert d.cause_ids == ("gloo_backend",)
    assert dr.diagnose(None).verdict == rules.NO_MEASUREMENT
    one = parse_topology("\tGPU0\tCPU Affinity\nGPU0\t X \t0-7\n")
    assert dr.diagnose(one, measurement=busbw(3)).verdict == rules.NO_PAIR


# ---- a shared switch uplink ---------------------------------------------------------------------

def test_a_switch_uplink_shared_by_staged_gpus():
    d = dr.doctor_case("shared_pcie_switch_uplink")
    ev = d.cause("shared_pcie_switch_uplink").evidence
    assert "GPU0, GPU1, GPU2, GPU3" in ev and "0000:01:00.0" in ev and f"{31.5 / 4:.3g} GB/s each" in ev
    assert d.cause_ids[:2] == ("no_p2p", "shared_pcie_switch_uplink")
    topo = read_topology_file(DOCTOR / "eight_gpu_4090_two_switches.txt")
    matrix_only = dr.diagnose(topo, facts=evidence.read_facts(DOCTOR / "facts_8x4090_no_p2p.json"),
                              measurement=busbw(5.6))
    assert "assumed PCIe 4.0 x16" in matrix_only.cause("shared_pcie_switch_uplink").evidence
    with_p2p = dr.diagnose(topo, facts=facts(8, p2p=True), measurement=busbw(5.6))
    assert "shared_pcie_switch_uplink" not in with_p2p.cause_ids


def test_a_narrow_switch_uplink_caps_a_ring_that_leaves_the_switch():
    text = (DOCTOR / "lspci_8x4090_switches.txt").read_text()
    head, rest = text.split("0000:01:00.0 PCI bridge", 1)
    block, tail = rest.split("\n\n", 1)
    block = block.replace("LnkSta:\tSpeed 16GT/s (ok), Width x16 (ok)",
                          "LnkSta:\tSpeed 16GT/s (ok), Width x8 (downgraded)")
    pci = pcie.parse_lspci(head + "0000:01:00.0 PCI bridge" + block + "\n\n" + tail)
    topo = read_topology_file(DOCTOR / "eight_gpu_4090_two_switches.txt")
    d = dr.diagnose(topo, facts=facts(8, p2p=True), pci=pci, measurement=busbw(14))
    ev = d.cause("shared_pcie_switch_uplink").evidence
    assert "PCIe 4.0 x8" in ev and "ring leaves the switch" in ev and "15.8 GB/s" in ev
    inside = dr.diagnose(topo, (0, 1, 2, 3), facts(8, p2p=True), pci=pci, measurement=busbw(14))
    assert "shared_pcie_switch_uplink" not in inside.cause_ids, "a ring inside the switch never uses the uplink"


# ---- ranking and the JSON contract ----------------------------------------------------------------

def test_shortfall_causes_rank_first_when_below_and_band_causes_when_as_expected():
    topo = load_sample("eight_gpu_pcie_switches")
    both = facts(8, name="NVIDIA GeForce RTX 4090", p2p=False, change={4: {"pcie_gen": 3}})
    below = dr.diagnose(topo, (0, 4), both, measurement=busbw(2))
    assert below.cause_ids == ("no_p2p", "pcie_gen_downtrained", "cross_socket")
    fine = dr.diagnose(topo, (0, 4), both, measurement=busbw(6))
    assert fine.verdict == rules.AS_EXPECTED
    assert fine.cause_ids == ("pcie_gen_downtrained", "cross_socket", "no_p2p")


def test_json_has_exactly_the_issue_keys(capsys):
    code, out, _ = run_cli(capsys, "--json", "--topo", "two_gpu_sys", "--facts", DOCTOR / "facts_2x5090_sys.json",
                           "--nccl-tests", SAMPLE_LOG, "--lspci", DOCTOR / "lspci_2x5090_sys.txt")
    doc = json.loads(out)
    assert code == 0 and tuple(doc) == dr.JSON_KEYS
    assert doc["verdict"] == "as expected" and doc["expected_GBps"] == [22.0, 50.0]
    assert doc["measured_GBps"] == pytest.approx(22.16) and doc["fraction"] == pytest.approx(22.16 / 50, abs=1e-3)
    assert doc["slowest_path"]["code"] == "SYS" and doc["slowest_path"]["gpus"] == ["GPU0", "GPU1"]
    assert all(set(c) == {"id", "evidence", "fix"} and c["id"] in rules.CAUSE_IDS for c in doc["causes"])
    code, out, _ = run_cli(capsys, "--json", "--topo", "two_gpu_sys")
    doc = json.loads(out)
    assert doc["verdict"] == "no measurement" and doc["measured_GBps"] is None and doc["fraction"] is None
    assert doc["expected_GBps"] == [22.0, 50.0], "the topology's sample facts give PCIe 5.0"


def test_text_report(capsys):
    code, out, _ = run_cli(capsys, "--topo", "eight_gpu_pcie_switches", "--gpus", "0,1",
                           "--facts", DOCTOR / "facts_8xl40s_gpu1_gen3.json", "--busbw", "12.6")
    assert code == 0
    for words in ("Bottleneck:   GPU0-GPU1 = PIX", "Expected:     12-15.75 GB/s", "Verdict:      as expected",
                  "1. pcie_gen_downtrained", "evidence:", "try:"):
        assert words in out


# ---- bad input: one line naming the value, exit 2, nothing started -------------------------------------

@pytest.fixture
def nothing_live(monkeypatch):
    def refuse(*_a, **_k):
        raise AssertionError("a live reading was started")

    for name in ("live_facts", "live_lspci", "newest_sweep"):
        monkeypatch.setattr(live, name, refuse)
    monkeypatch.setattr("labutils.readers.topology.live_topology", refuse)


@pytest.mark.parametrize("args, named", [
    (["--topo", "two_gpu_sys", "--gpus", "0,9"], "GPU9"),
    (["--topo", "two_gpu_sys", "--gpus", "0,a"], "gpus='0,a'"),
    (["--topo", "two_gpu_sys", "--gpus", "1"], "gpus=1"),
    (["--topo", "two_gpu_sys", "--gpus", "1,1"], "gpus=1,1"),
    (["--topo", "two_gpu_sys", "--facts", DOCTOR / "facts_8xl40s.json"], "describe 8 GPU(s) but the topology"),
    (["--topo", "two_gpu_sys", "--lspci", ROOT / "pyproject.toml"], "lspci="),
    (["--topo", "two_gpu_sys", "--lspci", ROOT / "data" / "topologies" / "two_gpu_sys.txt"], "lspci="),
    (["--busbw", "abc"], "busbw='abc'"),
    (["--busbw", "-3"], "busbw=-3.0"),
    (["--busbw", "0"], "busbw=0.0"),
    (["--busbw", "nan"], "busbw=nan"),
    (["--busbw", "inf"], "busbw=inf"),
    (["--busbw", "3", "--sweep", DOCTOR / "sweep_gloo_2x5090.json"], "not --busbw and --sweep"),
    (["--sweep", "nowhere.json"], "sweep='nowhere.json'"),
    (["--sweep", DOCTOR / "facts_8xl40s.json"], "sweep="),
    (["--nccl-tests", "nowhere.log"], "nccl_tests='nowhere.log'"),
    (["--facts", DOCTOR / "lspci_2x5090_sys.txt"], "is not JSON"),
    (["--topo", "nowhere"], "file='nowhere'"),
])
def test_bad_input_is_one_line_exit_2_and_starts_nothing(capsys, nothing_live, args, named):
    code, out, err = run_cli(capsys, *args)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and named in err, err


@pytest.mark.parametrize("rows, named", [
    ([{"index": 0, "name": "x"}], "lacks key(s) pcie_gen"),
    ([{**dict(index=0, name="x", pcie_gen=9, pcie_gen_max=4, pcie_width=16, pcie_width_max=16, nvlinks_active=0)}],
     "pcie_gen=9"),
    ([dict(index=1, name="x", pcie_gen=4, pcie_gen_max=4, pcie_width=16, pcie_width_max=16, nvlinks_active=0)],
     "index=1"),
    ([dict(index=0, name="x", pcie_gen=4, pcie_gen_max=4, pcie_width=16, pcie_width_max=16, nvlinks_active=0,
           p2p=[True, False])], "p2p must be 1 rows"),
    ({"p2p": []}, "'gpus' list"),
    ([], "non-empty list"),
])
def test_bad_facts_name_the_key(rows, named):
    with pytest.raises(LabInputError, match=None) as info:
        evidence.parse_facts(rows, "f.json")
    assert named in str(info.value) and "\n" not in str(info.value)


def test_facts_as_one_matrix_and_with_bus_ids():
    rows = [dict(index=i, name="NVIDIA L40S", pcie_gen=4, pcie_gen_max=4, pcie_width=16, pcie_width_max=16,
                 nvlinks_active=None, pci_bus_id=f"00000000:0{i + 1}:00.0") for i in range(2)]
    m = evidence.parse_facts({"gpus": rows[::-1], "p2p": [[True, False], [False, True]]})
    assert [g.index for g in m.gpus] == [0, 1] and m.p2p[0][1] is False and m.bus_ids[1] == "00000000:02:00.0"
    with pytest.raises(LabInputError, match="pci_bus_id"):
        evidence.parse_facts([{**rows[0], "pci_bus_id": "nope"}])


def test_bad_input_in_a_real_process():
    run = subprocess.run([sys.executable, "-m", "labutils", "doctor", "--topo", "two_gpu_sys", "--gpus", "0,5"],
                         cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.strip().splitlines() == ["error: gpus: GPU5 is not in the topology, which has GPU0..GPU1"]


# ---- the live path, with its readings faked -----------------------------------------------------------

def test_live_mode_reads_this_machine(monkeypatch):
    topo = load_sample("two_gpu_phb")
    monkeypatch.setattr("labutils.readers.topology.live_topology", lambda: (topo, ""))
    monkeypatch.setattr(live, "live_facts", lambda: (facts(2, name="NVIDIA GeForce RTX 4090", p2p=False), ""))
    monkeypatch.setattr(live, "live_lspci", lambda: (pcie.parse_lspci(TWO_ROOTS), "lspci needs root"))
    monkeypatch.setenv("NCCL_P2P_LEVEL", "SYS")
    record = json.loads((DOCTOR / "sweep_small_2x5090.json").read_text())
    import pandas as pd

    save_result("sweep", pd.read_csv(DOCTOR / "sweep_small_2x5090.csv"), {**record["meta"], "backend": "nccl"})
    d = dr.run_doctor()
    assert d.measurement is not None and "newest saved sweep" in d.measurement.source
    assert {"no_p2p", "messages_too_small", "acs_enabled"} <= set(d.cause_ids)
    assert "lspci needs root" in d.notes and any("NCCL_P2P_LEVEL=SYS" in n for n in d.notes)


def test_a_topology_file_keeps_the_rest_off_this_machine(monkeypatch, nothing_live):
    d = dr.run_doctor(busbw=22, topo="two_gpu_sys")
    assert d.verdict == rules.AS_EXPECTED and d.cause_ids[0] == "cross_socket"
    assert any("assumed gen 5" in n for n in d.notes)


def test_live_mode_on_a_cpu_machine(monkeypatch):
    monkeypatch.setattr("labutils.readers.topology.live_topology", lambda: (None, "nvidia-smi is not installed"))
    d = dr.run_doctor(sweep=DOCTOR / "sweep_gloo_2x5090.json")
    assert d.verdict == rules.NO_PAIR and d.cause_ids == ("gloo_backend",)
    assert any("python -m labutils doctor" in n for n in d.notes)


def test_gpu_mapping_by_bus_id_when_lspci_lists_more_gpus():
    devices = pcie.parse_lspci(TWO_ROOTS)
    topo = parse_topology("\tGPU0\tCPU Affinity\nGPU0\t X \t0-7\n")
    notes = []
    one = evidence.MachineFacts((GpuFacts(0, "NVIDIA L40S", 4, 4, 16, 16, 0),), None, ("00000000:02:00.0",))
    assert dr._gpu_devices(devices, 1, one, notes)[0].address == "0000:02:00.0" and not notes
    assert dr._gpu_devices(devices, 1, None, notes) is None and "cannot tell which is which" in notes[0]
    assert topo.gpus == ("GPU0",)


def test_live_readers_with_their_sources_faked(monkeypatch):
    import pandas as pd

    denied = "01:00.0 3D controller: NVIDIA Corporation AD102GL [L40S] (rev a1)\n\tCapabilities: <access denied>\n"
    monkeypatch.setattr("labutils.readers.sources.run_lspci", lambda: (denied, ""))
    devices, why = live.live_lspci()
    assert devices[0].access_denied and devices[0].link_width is None and "sudo lspci -vvv" in why
    monkeypatch.setattr("labutils.readers.sources.run_lspci", lambda: (None, "lspci is not installed"))
    assert live.live_lspci() == (None, "lspci is not installed")
    two = [GpuFacts(i, "NVIDIA L40S", 4, 4, 16, 16, 0) for i in range(2)]
    monkeypatch.setattr("labutils.readers.topology.nvml_facts", lambda: (two, ""))
    p2p = pd.DataFrame([[True, False], [False, True]])
    monkeypatch.setattr("labutils.measure.copies.peer_access_matrix", lambda: p2p)
    found, why = live.live_facts()
    assert found.gpus == tuple(two) and found.p2p == ((True, False), (False, True)) and why == ""
    monkeypatch.setattr("labutils.readers.topology.nvml_facts", lambda: ([], "NVML is not available"))
    assert live.live_facts() == (None, "NVML is not available")


def test_nccl_env_keeps_only_nccl_variables():
    assert live.nccl_env({"NCCL_DEBUG": "INFO", "PATH": "/bin"}) == {"NCCL_DEBUG": "INFO"}


# ---- the bottleneck: each pair at its own links ------------------------------------------------

def test_a_healthy_pair_is_never_judged_by_another_gpus_slow_link():
    """eight L40S, GPU5 at gen 3: the SYS crossing of healthy GPUs keeps gen 4's band; the group is
    bounded by GPU5's own link (its PIX pair at gen 3), the lower of the two."""
    topo = load_sample("eight_gpu_pcie_switches")
    slow5 = facts(8, change={5: {"pcie_gen": 3}})
    bound, crossing = dr.bottleneck(topo, tuple(range(8)), slow5)
    assert (crossing.code, crossing.band.high_GBps) == ("SYS", 24.0) and 5 not in (crossing.a, crossing.b)
    assert (bound.a, bound.b, bound.code, bound.band.high_GBps) == (4, 5, "PIX", 15.75)
    d = dr.diagnose(topo, None, slow5)
    assert d.slowest_path["gpus"] == ["GPU4", "GPU5"] and d.expected_GBps == (12.0, 15.75)
    assert "expect 11-24 GB/s here" in d.cause("cross_socket").evidence, "the crossing's own band"
    healthy = dr.diagnose(topo, (0, 4), slow5)
    assert healthy.expected_GBps == (11.0, 24.0), "GPU0-GPU4 run gen 4: GPU5 is not theirs"
    assert dr.diagnose(topo, (4, 5), slow5).expected_GBps == (12.0, 15.75)


def test_with_every_link_healthy_the_slowest_path_bounds_the_ring():
    """Every GPU at gen 4 x16: each GPU's PIX pair carries 24-31.5, the SYS crossing 11-24, so the
    crossing is the bound."""
    topo = load_sample("eight_gpu_pcie_switches")
    bound, crossing = dr.bottleneck(topo, tuple(range(8)), facts(8))
    assert bound == crossing and bound.code == "SYS"


def test_the_sys_label_names_no_route_the_path_table_denies():
    d = dr.doctor_case("cross_socket")
    assert "peer-to-peer" not in d.band.name and d.band.name == "SYS across sockets (PCIe 5.0 x16)"
    text = dr.format_diagnosis(d)
    assert "peer-to-peer (PCIe" not in text and "via SHM" in d.cause("no_p2p").evidence
