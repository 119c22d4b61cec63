"""Reading NCCL_DEBUG=INFO output: one row per connection, whatever the launcher did to the lines."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labutils.cli import main
from labutils.readers import nccl_debug as nd

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "data" / "nccl_debug"


def _rows(name):
    return nd.read_connections(SAMPLES / name)


def test_every_sample_is_listed_in_the_readme():
    readme = (SAMPLES / "README.md").read_text(encoding="utf-8")
    logs = sorted(p.name for p in SAMPLES.glob("*.log"))
    assert len(logs) == 5
    for name in logs:
        assert f"`{name}`" in readme


def test_nvlink_sample_p2p_cumem_with_prefixes_and_a_second_connection_index():
    rows = _rows("p2p_cumem_2gpu_nvlink_torchrun.log")
    assert len(rows) == 10  # 4 channels x 2 directions, the trees' repeats collapsed, + 2 on index 1
    assert {r.transport for r in rows} == {"P2P/CUMEM/read"}
    assert {r.family for r in rows} == {"P2P"}
    assert [(r.channel, r.conn, r.src_rank, r.dst_rank) for r in rows[:3]] == [(0, 0, 0, 1), (0, 0, 1, 0), (1, 0, 0, 1)]
    assert sum(r.conn == 1 for r in rows) == 2
    assert all(r.at == "device" and r.src_at == str(r.src_rank) for r in rows)
    assert all(r.ring for r in rows)


def test_shm_sample_including_a_glued_line():
    rows = _rows("shm_2gpu_sys.log")
    assert [(r.channel, r.src_rank, r.dst_rank, r.transport) for r in rows] == [
        (0, 0, 1, "SHM/direct/direct"), (0, 1, 0, "SHM/direct/direct"),
        (1, 0, 1, "SHM/direct/direct"), (1, 1, 0, "SHM/direct/direct")]
    assert nd.transport_family(rows[0].transport) == "SHM"
    assert "host memory" in nd.transport_meaning(rows[0].transport)


def test_old_nccl_bus_ids_and_no_connection_index():
    rows = _rows("p2p_ipc_4gpu_pcie_nccl28.log")
    assert len(rows) == 14  # per channel: the ring's 4 plus the tree's 3 upward connections
    assert {r.transport for r in rows} == {"P2P/IPC"}
    assert all(r.conn is None and r.at == "bus id" for r in rows)
    first = rows[0]
    assert (first.src_at, first.dst_at) == ("1a000", "1b000")
    ring = {(r.src_rank, r.dst_rank) for r in rows if r.ring and r.channel == 0}
    assert ring == {(0, 1), (1, 2), (2, 3), (3, 0)}
    assert {(r.src_rank, r.dst_rank) for r in rows if r.ring is False and r.channel == 0} == {(1, 0), (2, 1), (3, 2)}


def test_infiniband_sample_collapses_send_and_receive():
    rows = _rows("net_ib_2nodes_4gpu_srun.log")
    assert len(rows) == 16
    net = [r for r in rows if r.family == "NET/IB"]
    assert len(net) == 8 and all(r.logged == "send+receive" for r in net)
    assert {r.transport for r in net} == {"NET/IB/0/GDRDMA", "NET/IB/1/GDRDMA"}
    crossed = [r for r in net if r.receive_transport]
    assert [(r.channel, r.src_rank, r.dst_rank, r.transport, r.receive_transport) for r in crossed] == [
        (1, 3, 0, "NET/IB/1/GDRDMA", "NET/IB/0/GDRDMA")]
    ring = sorted((r.src_rank, r.dst_rank, r.family) for r in rows if r.ring and r.channel == 0)
    assert ring == [(0, 1, "P2P"), (1, 2, "NET/IB"), (2, 3, "P2P"), (3, 0, "NET/IB")]


def test_socket_sample():
    rows = _rows("net_socket_2nodes.log")
    assert [(r.channel, r.src_rank, r.dst_rank, r.transport, r.logged) for r in rows] == [
        (0, 0, 1, "NET/Socket/0", "send+receive"), (0, 1, 0, "NET/Socket/0", "send+receive"),
        (1, 0, 1, "NET/Socket/0", "send+receive"), (1, 1, 0, "NET/Socket/0", "send+receive")]
    assert rows[0].at == "bus id"


@pytest.mark.parametrize("line,expected", [
    ("h:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read", (0, 0, 0, 1, "P2P/CUMEM/read")),
    ("h:1:2 [0] NCCL INFO Channel 03 : 2[3d000] -> 3[3e000] via P2P/IPC", (3, None, 2, 3, "P2P/IPC")),
    ("h:1:2 [3] NCCL INFO Channel 02/0 : 3[3] -> 4[4] via P2P/direct pointer", (2, 0, 3, 4, "P2P/direct pointer")),
    ("h:1:2 [1] NCCL INFO Channel 00/1 : 1[1] -> 0[0] via P2P/IPC/read", (0, 1, 1, 0, "P2P/IPC/read")),
    ("h:1:2 [0] NCCL INFO Ring 00 : 0[0] -> 1[1] via P2P/IPC", (0, None, 0, 1, "P2P/IPC")),
    ("h:1:2 [0] NCCL INFO Ring 01 : 3 -> 0 [receive] via NET/IB/0", (1, None, 3, 0, "NET/IB/0")),
    ("h:1:2 [0] NCCL INFO Channel 00 : 0[0] -> 1[1] via direct shared memory", (0, None, 0, 1, "direct shared memory")),
    ("h:1:2 [7] NCCL INFO Channel 13/0 : 47[7] -> 39[7] [receive] via NET/IBext_v8/2",
     (13, 0, 47, 39, "NET/IBext_v8/2")),
    ("h:1:2 [0] NCCL INFO Channel 05/0 : 2[6] -> 3[7] via SHM/direct/direct", (5, 0, 2, 3, "SHM/direct/direct")),
])
def test_one_line_each_format(line, expected):
    (row,) = nd.parse_connections(line)
    assert (row.channel, row.conn, row.src_rank, row.dst_rank, row.transport) == expected


def test_lines_that_are_not_connections_give_nothing():
    text = "\n".join(["h:1:2 [0] NCCL INFO Channel 00/02 :    0   1   2   3",
                      "h:1:2 [0] NCCL INFO Trees [0] 1/-1/-1->0->-1 [1] 1/-1/-1->0->-1",
                      "h:1:2 [0] NCCL INFO Connected all rings", "NCCL version 2.21.5+cuda12.4",
                      "h:1:2 [0] NCCL WARN Call to connect returned Connection refused, retrying"])
    assert nd.parse_connections(text) == []
    assert nd.ring_orders(text) == {0: (0, 1, 2, 3)}
    assert nd.parse_connections(None) == [] and nd.parse_connections(b"bytes") == []


def test_families_and_meanings():
    for transport, family in [("P2P/CUMEM/read", "P2P"), ("SHM/direct/direct", "SHM"), ("NET/IB/0/GDRDMA", "NET/IB"),
                              ("NET/Socket/0", "NET/Socket"), ("NET/AWS Libfabric/0", "NET"), ("CollNet", "COLLNET"),
                              ("NVLS", "other")]:
        assert nd.transport_family(transport) == family
        assert nd.transport_meaning(transport).startswith(family)
    assert "GPUDirect RDMA" in nd.transport_meaning("NET/IB/0/GDRDMA")
    assert "cuMem" in nd.transport_meaning("P2P/CUMEM/read")


def test_settings_table_names_the_three_variables():
    table = nd.settings_table()
    assert list(table.index) == ["NCCL_P2P_DISABLE", "NCCL_P2P_LEVEL", "NCCL_SHM_DISABLE"]
    assert "SYS" in table.loc["NCCL_P2P_LEVEL", "values"] and "NET/" in table.loc["NCCL_SHM_DISABLE",
                                                                                  "what the log then shows"]


def test_summary_counts_each_transport_and_names_its_rank_pairs():
    rows = _rows("net_ib_2nodes_4gpu_srun.log")
    table = nd.summary(rows).set_index("transport")
    assert table.loc["P2P/CUMEM/read", "connections"] == 8
    assert table["connections"].sum() == len(rows)
    assert "1->2" in table.loc["NET/IB/0/GDRDMA", "rank pairs"] and "1->2" in table.loc["NET/IB/1/GDRDMA", "rank pairs"]
    assert "0->1" in table.loc["P2P/CUMEM/read", "rank pairs"]


# --- property tests: never raises; prefixes, noise and order change nothing ---

PREFIXES = ["", "[rank0]:", "[rank3]:", "0: ", "12: ", "[1,0]<stdout>:", "[default0]:",
            "2025-11-12 20:42:20,261 - INFO - ", "worker-1 | "]
NOISE = ["", "NCCL version 2.21.5+cuda12.4", "h:1:1 [0] NCCL WARN NET/Plugin: No plugin found",
         "/x/distributed_c10d.py:4631: UserWarning: No device id is provided", "  warnings.warn(",
         "h:1:2 [0] NCCL INFO Connected all rings", "Traceback (most recent call last):", "step 10 loss 2.31"]


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_never_raises_on_any_text(text):
    rows = nd.parse_connections(text)
    assert isinstance(rows, list)
    nd.ring_orders(text)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("Channel Ring 0123456789/:[]->abc via P2P SHM NET IB \n"))))
def test_never_raises_on_near_misses(text):
    for row in nd.parse_connections(text):
        assert row.transport and row.channel >= 0


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(sorted(p.name for p in SAMPLES.glob("*.log"))), st.randoms(use_true_random=False),
       st.lists(st.sampled_from(PREFIXES), min_size=1, max_size=4), st.lists(st.sampled_from(NOISE), max_size=10))
def test_interleaving_prefixes_and_noise_change_nothing(name, rnd, prefixes, noise):
    text = (SAMPLES / name).read_text(encoding="utf-8")
    lines = text.splitlines()
    rnd.shuffle(lines)
    messy = [rnd.choice(prefixes) + line for line in lines + noise]
    rnd.shuffle(messy)
    messy += rnd.sample(messy, k=min(5, len(messy)))  # some lines logged twice
    assert nd.parse_connections("\n".join(messy)) == nd.parse_connections(text)


def test_a_send_and_its_receive_in_either_order_are_one_row():
    send = "a:1:2 [1] NCCL INFO Channel 00/0 : 1[1] -> 2[0] [send] via NET/IB/0/GDRDMA"
    receive = "b:3:4 [0] NCCL INFO Channel 00/0 : 1[1] -> 2[0] [receive] via NET/IB/0/GDRDMA"
    one = nd.parse_connections(send + "\n" + receive)
    assert one == nd.parse_connections(receive + "\n" + send)
    assert len(one) == 1 and one[0].logged == "send+receive" and one[0].receive_transport is None
    only = nd.parse_connections(receive)
    assert only[0].logged == "receive" and only[0].transport == "NET/IB/0/GDRDMA"


# --- the command line ---

def test_cli_table_and_json(capsys):
    log = str(SAMPLES / "net_ib_2nodes_4gpu_srun.log")
    assert main(["nccl-transports", log]) == 0
    out = capsys.readouterr().out
    assert "NET/IB/0/GDRDMA" in out and "send+receive" in out and "receiver printed NET/IB/0/GDRDMA" in out
    assert main(["nccl-transports", log, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert len(data) == 16 and set(data[0]) == set(nd.COLUMNS)


@pytest.mark.parametrize("make,needle", [
    (lambda d: d / "missing.log", "does not exist"),
    (lambda d: d, "is a directory"),
    (lambda d: (d / "empty.log").write_text("NCCL version 2.21.5\nno connections here\n") and d / "empty.log",
     "no NCCL connection line"),
])
def test_cli_bad_input_exits_2_with_one_line(tmp_path, capsys, make, needle):
    path = make(tmp_path)
    assert main(["nccl-transports", str(path)]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and str(path) in lines[0] and captured.out == ""


def test_cli_as_a_program():
    run = subprocess.run([sys.executable, "-m", "labutils", "--help"], capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 0 and "nccl-transports" in run.stdout
    run = subprocess.run([sys.executable, "-m", "labutils", "nccl-transports", "no/such/file.log"],
                         capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1



def test_samples_overview_names_the_ring_transports():
    table = nd.samples_overview()
    assert len(table) == 5
    assert table.loc["shm_2gpu_sys.log", "ring connections use"] == "SHM/direct/direct (4)"
    assert table.loc["net_ib_2nodes_4gpu_srun.log", "ring connections use"] == (
        "NET/IB/0/GDRDMA (2), NET/IB/1/GDRDMA (2), P2P/CUMEM/read (4)")
    assert "RTX 5090" in table.loc["shm_2gpu_sys.log", "about"]


def test_capture_sets_and_restores_nccl_s_variables(tmp_path, monkeypatch):
    monkeypatch.setenv("NCCL_DEBUG", "WARN")
    monkeypatch.delenv("NCCL_DEBUG_FILE", raising=False)
    with nd.capture(tmp_path / "logs") as text:
        import os

        assert os.environ["NCCL_DEBUG"] == "INFO" and os.environ["NCCL_DEBUG_FILE"].endswith("nccl.%h.%p.log")
        line = "h:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read\n"
        (tmp_path / "logs" / "nccl.h.1.log").write_text(line)  # what a rank started here would write
        (tmp_path / "logs" / "nccl.h.2.log").write_text(line.replace("0 : 0[0] -> 1[1]", "0 : 1[1] -> 0[0]"))
        assert len(nd.parse_connections(text())) == 2
    import os

    assert os.environ["NCCL_DEBUG"] == "WARN" and "NCCL_DEBUG_FILE" not in os.environ


@pytest.mark.parametrize("transport, kind", [
    ("P2P/CUMEM/read", "direct"), ("P2P/IPC", "direct"), ("P2P/direct pointer", "direct"),
    ("SHM/direct/direct", "host memory"), ("direct shared memory", "host memory"),
    ("NET/IB/0/GDRDMA", "network"), ("NET/Socket/0", "network"), ("NET/AWS Libfabric/0", "network"),
    ("CollNet/x", "network"), ("MYSTERY", "")])
def test_path_kind(transport, kind):
    assert nd.path_kind(transport) == kind


def test_connection_lines_keep_one_channel_as_logged():
    lines = nd.connection_lines(SAMPLES / "net_ib_2nodes_4gpu_srun.log", channel=0)
    assert lines and all("Channel 00/0 :" in line and " via " in line for line in lines)
    assert lines[0].startswith("0: node-a")  # the launcher's prefix kept
    assert len(lines) == len(set(lines))  # a line logged twice (the trees) is shown once
    assert any("1[1] -> 2[0] [send] via NET/IB/0/GDRDMA" in line for line in lines)
    assert not any("Channel 01" in line for line in lines)
    old = nd.connection_lines(SAMPLES / "p2p_ipc_4gpu_pcie_nccl28.log", channel=1)
    assert len(old) == 7 and all("Channel 01 :" in line for line in old)  # 4 ring + 3 tree


# --- the corpus: layouts people pasted in public threads, recreated (data/nccl_debug/corpus/README.md) ---

CORPUS = SAMPLES / "corpus"
# file -> (connections, transports as printed, families, what the brackets hold)
LAYOUTS = {
    "ipc_read_socket_16ranks.log": (7, {"P2P/IPC/read", "NET/Socket/3"}, {"P2P", "NET/Socket"}, "device"),
    "ring_bus_ids_no_host.log": (6, {"P2P/IPC", "NET/IB/1/GDRDMA"}, {"P2P", "NET/IB"}, "bus id"),
    "channel_no_index_ib_two_hosts.log": (6, {"P2P/IPC/read", "NET/IB/0/GDRDMA"}, {"P2P", "NET/IB"}, "bus id"),
    "shm_channel_no_index_h800.log": (4, {"SHM/direct/direct"}, {"SHM"}, "device"),
    "direct_pointer_one_process.log": (4, {"P2P/direct pointer"}, {"P2P"}, "device"),
    "direct_pointer_read_nvlink.log": (3, {"P2P/direct pointer/read"}, {"P2P"}, "device"),
    "aws_libfabric_mpirun_tag_output.log": (2, {"NET/AWS Libfabric/0/GDRDMA"}, {"NET"}, "bus id"),
    "cloudwatch_pipes_cumem_read.log": (4, {"P2P/CUMEM/read"}, {"P2P"}, "device"),
    "cumem_without_read_ib_h20.log": (5, {"P2P/CUMEM", "NET/IB/2/GDRDMA", "NET/IB/3/GDRDMA"}, {"P2P", "NET/IB"},
                                      "device"),
    "k8s_pod_hostnames_cumem.log": (3, {"P2P/CUMEM"}, {"P2P"}, "device"),
    "rccl_comm_suffix.log": (2, {"P2P/IPC", "NET/AWS Libfabric/2/GDRDMA"}, {"P2P", "NET"}, "bus id"),
    "collnet_sharp_only.log": (4, {"COLLNET/SHARP/0/GDRDMA", "COLLNET/SHARP/1"}, {"COLLNET"}, ""),
    "pxn_proxy_pci_shared.log": (2, {"NET/IB/2(1)/GDRDMA", "NET/IB/2/GDRDMA(PCI)/Shared"}, {"NET/IB"}, "device"),
    "indirect_and_ce.log": (3, {"P2P/indirect/1[1]/read", "P2P/CUMEM/CE", "P2P/MNNVL/read"}, {"P2P"}, "device"),
    "nccl24_direct_shared_memory.log": (3, {"direct shared memory", "P2P/common device"}, {"SHM", "P2P"}, "device"),
    "torchrun_rank_prefix_markdown.log": (2, {"P2P/CUMEM/read"}, {"P2P"}, "device"),
}


def test_every_corpus_layout_is_tested_and_has_its_provenance():
    readme = (CORPUS / "README.md").read_text(encoding="utf-8")
    assert sorted(p.name for p in CORPUS.glob("*.log")) == sorted(LAYOUTS)
    for name in LAYOUTS:
        row = next(line for line in readme.splitlines() if line.startswith(f"| `{name}`"))
        assert len(row.split("|")[2].strip()) > 20, f"{name}: the README names where the layout comes from"


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_each_corpus_layout_is_read_whole(name):
    count, transports, families, at = LAYOUTS[name]
    rows = nd.read_connections(CORPUS / name)
    assert len(rows) == count
    assert {r.transport for r in rows} == transports
    assert {r.family for r in rows} == families
    assert {r.at for r in rows if r.at} == ({at} if at else set())


def test_a_plugin_name_with_a_space_and_the_receivers_shorter_string():
    rows = nd.read_connections(CORPUS / "aws_libfabric_mpirun_tag_output.log")
    assert [(r.src_rank, r.dst_rank, r.logged, r.receive_transport) for r in rows] == [
        (0, 1, "send+receive", "NET/AWS Libfabric/0"), (1, 0, "send+receive", "NET/AWS Libfabric/0")]
    assert nd.path_kind(rows[0].transport) == "network"


def test_collnet_rows_have_one_rank_and_the_cli_reads_a_log_of_only_them(capsys):
    rows = nd.read_connections(CORPUS / "collnet_sharp_only.log")
    assert [(r.channel, r.conn, r.src_rank, r.dst_rank, r.logged) for r in rows] == [
        (0, 0, None, 4, "receive"), (0, 0, 4, None, "send"), (1, None, None, 5, "receive"), (1, None, 5, None, "send")]
    assert nd.summary(rows).set_index("transport").loc["COLLNET/SHARP/1", "rank pairs"] == "CollNet->5, 5->CollNet"
    assert main(["nccl-transports", str(CORPUS / "collnet_sharp_only.log")]) == 0
    out = capsys.readouterr().out
    assert "4 -> CollNet" in out and "CollNet -> 4" in out and "in-network reduction" in out


@pytest.mark.parametrize("tail, transport", [
    ("via NET/AWS Libfabric/0", "NET/AWS Libfabric/0"), ("via P2P/direct pointer/read", "P2P/direct pointer/read"),
    ("via NET/IB/0/GDRDMA", "NET/IB/0/GDRDMA"), ("via P2P/CUMEM/read", "P2P/CUMEM/read"),
    ("via SHM/direct/direct", "SHM/direct/direct"), ("via SHM/direct", "SHM/direct"),
    ("via SHM/CE/direct", "SHM/CE/direct"),
    ("[send] via NET/IBext_v8/3/GDRDMA", "NET/IBext_v8/3/GDRDMA"), ("via NET/OFI/0", "NET/OFI/0"),
    ("via P2P/IPC/read comm 0x5f1e2a0 nRanks 16", "P2P/IPC/read"),
    ("via P2P/indirect/2[3d000]/read", "P2P/indirect/2[3d000]/read"),
    ("[receive] via NET/Socket/1/Shared", "NET/Socket/1/Shared"), ("via P2P/CUMEM/read`.", "P2P/CUMEM/read"),
])
def test_transport_strings_as_nccl_prints_them(tail, transport):
    (row,) = nd.parse_connections(f"h:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] {tail}")
    assert row.transport == transport


@pytest.mark.parametrize("make, words", [
    (lambda d: "/dev/zero", "is a character device"),
    (lambda d: (os.mkfifo(d / "fifo"), d / "fifo")[1], "named pipe (FIFO)"),
    (lambda d: d, "is a directory"),
    (lambda d: ((d / "bin.log").write_bytes(b"\x00\x01" * 100), d / "bin.log")[1], "binary data"),
])
def test_cli_on_hostile_files_says_what_they_are(tmp_path, capsys, make, words):
    path = make(tmp_path)
    assert main(["nccl-transports", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.strip().splitlines()) == 1 and words in captured.err
