# Run from the repository root: python data/nccl_tests/corpus/make_corpus.py
"""Writes data/nccl_tests/corpus: each layout seen in a public thread, with made-up hosts and numbers
from a latency + bandwidth model, printed as nccl-tests prints them."""
import json, math, os
OUT = "data/nccl_tests/corpus"
TS = {"float": 4, "half": 2, "bfloat16": 2, "double": 8, "int8": 1, "f8e4m3": 1, "int32": 4}
PER_RANK = {"all_gather", "reduce_scatter", "alltoall", "gather", "scatter"}
def factor(op, n):
    return 2 * (n - 1) / n if op == "all_reduce" else ((n - 1) / n if op in PER_RANK else 1.0)
def fstr(v, w):
    for f in ("%*.2f", "%*.1f", "%*.0f"):
        s = f % (w, v)
        if len(s) <= w:
            return s
    return ("%*.1e" if w >= 7 else "%*.0e") % (w, v)
def old_t(v):  # 2.x before getFloatStr: 4 significant figures then whole us
    return "%7.2f" % v if v < 100 else ("%7.1f" % v if v < 10000 else "%7.0f" % v)
def times(size, lat, bw, jitter):
    return lat + size / (bw * 1e3), (lat + size / (bw * 1e3)) * (1 + jitter)
EXPECT = {}
def table(name, op, n, sizes, lat, bw, *, dtype="float", redop="sum", root="-1", layout="new", wrong="0",
          wrong2=None, prefix="", old_conv=False, tfmt=None, inplace=True, rows_of=None, redops=None):
    out, exp = [], []
    for r in (redops or [redop]):
        for size in sizes:
            ts = TS[dtype]
            count = size // ts // (n if op in PER_RANK else 1)
            size = count * ts * (n if op in PER_RANK else 1)
            cells = f"{size:12d}  {count:12d}  {dtype:>8s}"
            if layout == "new":
                cells += f"  {r:>6s}  {root:>6s}"
            elif layout == "old_redop":
                cells += f"  {r:>6s}"
            elif layout == "old_blank":
                cells += "        "
            elif layout == "old_root":
                cells += f"  {root:>6s}"
            halves = []
            for k, t in enumerate(times(size, lat, bw, 0.013)):
                if not inplace and k:
                    break
                alg = size / t / 1e3
                if old_conv:
                    alg *= (n - 1) / n
                bus = alg * (1.0 if old_conv else factor(op, n))
                ts_ = (tfmt or (lambda v: fstr(v, 7)))(t)
                a_, b_ = fstr(alg, 6), fstr(bus, 6)
                w = wrong if k == 0 or wrong2 is None else wrong2
                cells += f"  {ts_}  {a_}  {b_}  {w:>6s}"
                halves.append([float(ts_), float(a_), float(b_)])
            out.append(prefix + cells)
            exp.append([size, halves])
    return out, exp
def write(name, op, world, lines, exp, note):
    with open(os.path.join(OUT, name), "w") as f:
        f.write("\n".join(lines) + "\n")
    named = any(op + "_perf" in ln for ln in lines)
    EXPECT[name] = {"op": op, "world_size": world, "rows": exp, "op_named": named}
HDR_NEW = ["#                                                              out-of-place                       in-place          ",
           "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong",
           "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)       "]
HDR_OLD = ["#                                                       out-of-place                       in-place          ",
           "#       size         count      type   redop     time   algbw   busbw  error     time   algbw   busbw  error",
           "#        (B)    (elements)                       (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)  "]
HDR_NOREDOP = ["#                                           out-of-place                       in-place          ",
               "#       size         count      type     time   algbw   busbw  error     time   algbw   busbw  error",
               "#        (B)    (elements)                 (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)  "]
HDR_ROOT = ["#                                                     out-of-place                       in-place          ",
            "#       size         count      type    root     time   algbw   busbw  error     time   algbw   busbw  error",
            "#        (B)    (elements)                       (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)       "]
def pre(n, g, gpu, hosts, pids_per_host, *, group=True, t=1, minb=8, maxb=134217728, extra="agg iters: 1 validation: 1 graph: 0", hashes="#"):
    h = hashes
    lines = [f"{h} nThread {t} nGpus {g} minBytes {minb} maxBytes {maxb} step: 2(factor) warmup iters: 5 iters: 20 {extra}", h, f"{h} Using devices"]
    r = 0
    for hi, host in enumerate(hosts):
        for p in range(pids_per_host):
            for d in range(n // len(hosts) // pids_per_host):
                dev = p * (n // len(hosts) // pids_per_host) + d
                pid = 3000 + 17 * hi + (p if pids_per_host > 1 else 0)
                grp = " Group  0" if group else ""
                sp = "  " if group else "   "
                lines.append(f"{h}{sp}Rank {r:2d}{grp} Pid {pid:6d} on {host:>10s} device {dev:2d} [0x{16 + dev:02x}] {gpu}")
                r += 1
    return lines + [h]
P2 = [8 << k for k in range(0, 25, 3)]
L = {}
def avg(exp):
    return sum(h[0][2] for _, h in exp) / len(exp)
# 01 nccl-tests#29: 32 ranks over 4 servers, mpirun, NCCL INFO Init COMPLETE lines before the header
rows, exp = table("x", "all_reduce", 32, P2, 60.0, 9.0)
info = [f"node{k % 4 + 1}:{5100 + k}:{5200 + k} [{k % 8}] NCCL INFO comm 0x7f{k:04x}0001ca0 rank {k} nranks 32 cudaDev {k % 8} nvmlDev {k % 8} - Init COMPLETE" for k in (3, 17, 30)]
write("01_mpirun_32ranks_info.log", "all_reduce", 32, pre(32, 1, "Tesla V100-SXM2-32GB", ["node1", "node2", "node3", "node4"], 8) + info + HDR_NEW + rows + ["# Out of bounds values : 0 OK", f"# Avg bus bandwidth    : {avg(exp):.5g} ", "#"], exp, "")
# 02 nccl#1530: one process -g 8, eight RTX 4090, command with NCCL_ALGO
rows, exp = table("x", "all_reduce", 8, P2, 40.0, 6.5)
write("02_single_process_g8.log", "all_reduce", 8, ["NCCL_ALGO=TREE ./all_reduce_perf -g 8 -b 8 -e 128M -f 2"] + pre(8, 8, "NVIDIA GeForce RTX 4090", ["rig07"], 1) + HDR_NEW + rows + ["# Out of bounds values : 0 OK", f"# Avg bus bandwidth    : {avg(exp):.5g} "], exp, "")
# 03 nccl-tests#107: mpirun -np 2 of a build without MPI=1: two 1-rank runs, their lines interleaved
rows, exp = table("x", "all_reduce", 1, [1310720000], 5.0, 300.0, layout="old_redop", wrong="0e+00")
p1 = pre(1, 1, "Tesla V100-SXM2-16GB", ["ip-10-0-1-5"], 1, group=False, minb=1310720000, maxb=1310720000, extra="validation: 1")
p2 = [ln.replace("ip-10-0-1-5", "ip-10-0-1-9").replace("3000", "4122") for ln in p1]
write("03_mpirun_without_mpi_build.log", "all_reduce", 1, ["$ mpirun -host localhost,10.0.1.9 -np 2 /home/me/nccl-tests/build/all_reduce_perf -b 1250M -e 1250M -g 1"] + p1[:3] + p2[:3] + p1[3:] + p2[3:] + HDR_OLD + HDR_OLD + rows + rows + [" Out of bounds values : 0 OK", " Avg bus bandwidth    : 0 "] * 2, exp + exp, "")
# 04 nccl#340 / nccl-tests#44: all_gather before 2.6 (algbw carries (N-1)/N, busbw = algbw), no redop
rows, exp = table("x", "all_gather", 2, [32768 << k for k in range(13)], 8.0, 22.0, layout="old", wrong="0e+00", old_conv=True, tfmt=old_t, dtype="float")
write("04_old_all_gather_busbw_equals_algbw.log", "all_gather", 2, ["./all_gather_perf -b 8 -e 128M -f 2 -g 2"] + pre(2, 2, "GeForce RTX 2080 Ti", ["desk"], 1, group=False, extra="validation: 1") + HDR_NOREDOP + rows + ["# Out of bounds values : 0 OK", "# Avg bus bandwidth    : 6.1 "], exp, "")
# 05 nccl-tests#128: reduce_scatter on 2 nodes x 4 GPUs with size 0 rows
rows, exp = table("x", "reduce_scatter", 8, [0, 0, 128, 256, 512, 4096, 65536, 1048576], 24.0, 12.0)
write("05_reduce_scatter_zero_sizes.log", "reduce_scatter", 8, HDR_NEW + rows, exp, "")
# 06 nccl-tests#78: alltoall 2.x on 64 ranks, the redop cell blank, whole-us times
rows, exp = table("x", "alltoall", 64, [268435456, 536870912], 900.0, 0.515, layout="old_blank", wrong="0e+00", wrong2="1e+00")
write("06_old_alltoall_blank_redop.log", "alltoall", 64, ["#"] + HDR_OLD + rows + ["# Out of bounds values : 0 OK", "# Avg bus bandwidth    : 0.5087 "], exp, "")
# 07 nccl-tests#78: all_reduce 2.x on 64 ranks, large sizes only
rows, exp = table("x", "all_reduce", 64, [268435456, 536870912], 300.0, 2.2, layout="old_redop", wrong="2e-06")
write("07_old_all_reduce_64ranks.log", "all_reduce", 64, ["#"] + HDR_OLD + rows + ["# Out of bounds values : 0 OK", "# Avg bus bandwidth    : 4.3 "], exp, "")
# 08 nccl#644: all_gather 2.x on 8 ranks with today's convention, whole-us times past 10 ms
rows, exp = table("x", "all_gather", 8, [65536 << k for k in range(14)], 45.0, 8.4, layout="old", wrong="0e+00", tfmt=old_t)
write("08_old_all_gather_8ranks.log", "all_gather", 8, HDR_NOREDOP + rows, exp, "")
# 09 nccl#258: mpirun -np 1 ... -g 4: old error layout, one process
rows, exp = table("x", "all_reduce", 4, [8 << k for k in range(10)], 158.0, 9.0, layout="old_redop", wrong="3e-08", tfmt=old_t)
write("09_mpirun_np1_g4_old.log", "all_reduce", 4, ["mpirun -np 1 ./build/all_reduce_perf -b 8 -e 128M -f 2 -g 4"] + pre(4, 4, "Tesla V100-SXM3-32GB", ["c0ffee42"], 1, group=False, extra="validation: 1")[3:] + HDR_OLD + rows, exp, "")
S = [134217728, 268435456, 536870912, 1073741824, 2147483648]
# 10 nccl-tests#294: 16 ranks on two hosts, PCI domain device ids
rows, exp = table("x", "all_reduce", 16, S, 80.0, 95.0)
p = [ln.replace("[0x", "[0002:00:0") for ln in pre(16, 1, "NVIDIA H100 80GB HBM3", ["h100-a", "h100-b"], 8, minb=134217728, maxb=2147483648)]
write("10_two_hosts_16ranks_pci_domains.log", "all_reduce", 16, p + HDR_NEW + rows, exp, "")
# 11 nccl-tests#249: the '#' of every comment line eaten by the web page; one A10G, -z 1 blocking
rows, exp = table("x", "all_reduce", 1, [8 << k for k in range(0, 22, 3)], 6.0, 200.0)
p = [ln.lstrip("#") for ln in pre(1, 1, "NVIDIA A10G", ["worker-0"], 1)]
write("11_markdown_ate_the_hashes.log", "all_reduce", 1, ["mpirun -n 1 -x FI_PROVIDER=efa -host 10.1.2.3:1 /opt/nccl-tests/build/all_reduce_perf -b 8 -e 16M -f 2 -g 1 -z 1 -n 5"] + p[:1] + [" Blocking Enabled: wait for completion and barrier after each collective "] + p[1:] + [h.lstrip("#") for h in HDR_NEW] + rows + [" Out of bounds values : 0 OK", " Avg bus bandwidth    : 0 "], exp, "")
# 12 aws-k8s-tester#503: mpirun --tag-output prefixes on every line, trailing blanks
rows, exp = table("x", "all_reduce", 16, [8 << k for k in range(0, 28, 3)], 12.9, 120.0, prefix="[1,0]<stdout>:")
write("12_tag_output_prefixes.log", "all_reduce", 16, ["[1,0]<stdout>:" + ln for ln in pre(16, 1, "NVIDIA H100 80GB HBM3", ["p5-a", "p5-b"], 8)] + ["[1,0]<stdout>:" + h + "      " for h in HDR_NEW] + rows + ["[1,0]<stdout>:# Out of bounds values : 0 OK", "[1,0]<stdout>:# Avg bus bandwidth    : 92.1 "], exp, "")
# 13 nebius/soperator#428: srun --nodes=2 --ntasks-per-node=8 all_reduce_perf_mpi -g 1
rows, exp = table("x", "all_reduce", 16, [536870912 << k for k in range(5)], 90.0, 180.0)
write("13_srun_all_reduce_perf_mpi.log", "all_reduce", 16, ["srun --exclusive --mem=0 --nodes=2 --ntasks-per-node=8 --gpus-per-node=8 --mpi=pmix all_reduce_perf_mpi -b 512M -e 8G -f 2 -g 1"] + pre(16, 1, "NVIDIA H100 80GB HBM3", ["worker-1", "worker-0"], 8, minb=536870912, maxb=8589934592) + HDR_NEW + rows, exp, "")
# 14 nccl#1218: a multi-line mpirun (backslashes) -np 32 ... all_gather_perf -g 8 -c 0: 256 ranks, #wrong N/A
rows, exp = table("x", "all_gather", 256, [2147483648], 400.0, 200.0, wrong="N/A")
cmd = ["/opt/openmpi/bin/mpirun \\", "     --bind-to none \\", "     -np 32 -H hosts.txt \\", "     -x NCCL_DEBUG=WARN \\", "     /nccl-tests/build/all_gather_perf -b 2G -e 2G -f 2 -g 8 -t 1 -c 0 -n 1"]
write("14_multiline_mpirun_g8_256ranks.log", "all_gather", 256, cmd + HDR_NEW + rows, exp, "")
# 15 nccl-tests#293: mpirun -np 2 ... -g 1 with NCCL INFO lines between the rank lines and the header
rows, exp = table("x", "all_reduce", 2, [8 << k for k in range(0, 28, 3)], 25.0, 9.0)
p = pre(2, 1, "NVIDIA A100-PCIE-40GB", ["lab1", "lab2"], 1)
info = ["lab1:3000:3000 [0] NCCL INFO Bootstrap : Using eno1:10.9.0.1<0>", "NCCL version 2.21.5+cuda12.4", "lab2:3017:3017 [0] NCCL INFO cudaDriverVersion 12040"]
write("15_mpirun_np2_g1_info_lines.log", "all_reduce", 2, ["root@lab1:/# mpirun --allow-run-as-root -np 2 -H 10.9.0.1:1,10.9.0.2:1 -x NCCL_DEBUG=INFO /nccl-tests/build/all_reduce_perf -b 8 -e 1G -f 2 -g 1"] + p[:-1] + info + ["#"] + HDR_NEW + rows, exp, "")
# 16 coreweave/nccl-tests#43: 72 ranks (an NVL72 rack), whole-us times, three-digit busbw
rows, exp = table("x", "all_reduce", 72, [536870912 << k for k in range(5)], 30.0, 420.0)
write("16_nvl72_72ranks.log", "all_reduce", 72, pre(72, 1, "NVIDIA GB200", [f"gb-{k:02d}" for k in range(18)], 1)[-3:] + HDR_NEW + rows + ["# Out of bounds values : 0 OK", "# Avg bus bandwidth    : 740.2 "], exp, "")
# 17 dgx-spark-playbooks#103: nccl-tests 2.20 version line, unalign in the header, a wider #wrong column
rows, exp = table("x", "all_reduce", 2, [8192 << k for k in range(0, 18, 3)], 30.0, 24.0)
rows = [r + "" for r in rows]
hdr = [HDR_NEW[0], HDR_NEW[1].replace(" #wrong", "  #wrong"), HDR_NEW[2]]
write("17_v2_20_version_line.log", "all_reduce", 2, ["# nccl-tests version 2.20.0 (b4d5bee) nccl-headers=23102 nccl-library=23102", "# Collective test starting: all_reduce_perf"] + pre(2, 1, "NVIDIA GB10", ["spark-a", "spark-b"], 1, minb=8192, maxb=8589934592, extra="agg iters: 1 validation: 1 graph: 0 unalign: 0") + hdr + rows, exp, "")
# 18 nccl#583: mpirun -np 8 without -g, old error layout, the '#' eaten
rows, exp = table("x", "all_reduce", 8, [32 << k for k in range(0, 28, 3)], 30.0, 85.0, layout="old_redop", wrong="2e-07", tfmt=old_t)
p = [ln.lstrip("#") for ln in pre(8, 1, "NVIDIA A100-SXM4-40GB", ["box01"], 8, group=False, minb=32, maxb=8589934592, extra="validation: 1 single_test: 0 test_buffer_kind: 2")]
write("18_mpirun_np8_no_g_hashes_eaten.log", "all_reduce", 8, ["mpirun -np 8 all_reduce_perf -b 32 -f 2 -e 8G"] + p + [h.lstrip("#") for h in HDR_OLD] + rows, exp, "")
# 19 nccl-tests#82: broadcast 2.x with a root column and no redop, -c 0 (error N/A), NCCL WARN lines
rows, exp = table("x", "broadcast", 2, [8 << k for k in range(0, 28, 3)], 45.0, 1.1, layout="old_root", root="0", wrong="N/A", tfmt=old_t)
p = pre(2, 1, "Tesla V100-PCIE-16GB", ["v100-a", "v100-b"], 1, group=False, minb=8, maxb=2147483648, extra="validation: 0 ")
warn = ["", "v100-a:3000:3000 [0] misc/ibvwrap.cc:63 NCCL WARN Failed to open libibverbs.so[.1]", "NCCL version 2.9.6+cuda11.2", ""]
write("19_old_broadcast_root_no_redop.log", "broadcast", 2, ["$ mpirun --bind-to none -np 2 --host 10.0.0.4:1,10.0.0.5:1 ./build/broadcast_perf -b 8 -e 2G -w 10 -f 2 -g 1 -n 100 -c 0"] + p[:-1] + warn + HDR_ROOT + rows, exp, "")
# 20 nccl-tests#214: sendrecv between two nodes, the in-place #wrong N/A
rows, exp = table("x", "sendrecv", 2, [256 << k for k in range(0, 22, 3)], 31.0, 11.0, wrong="0", wrong2="N/A")
write("20_sendrecv_inplace_na.log", "sendrecv", 2, pre(2, 1, "NVIDIA A40", ["gpu23", "gpu24"], 1, minb=256, maxb=1073741824) + HDR_NEW + rows, exp, "")
# 21 nccl-tests#232: --hostfile, -np 2 ... -g 1, NCCL_ALGO=Tree; no rank lines kept
rows, exp = table("x", "all_reduce", 2, [2097152 << k for k in range(0, 13, 2)], 8.0, 46.0)
write("21_hostfile_np2_g1_no_rank_lines.log", "all_reduce", 2, ["$ mpirun --allow-run-as-root --hostfile hosts.txt --oversubscribe -x NCCL_ALGO=Tree -np 2 ./all_reduce_perf -b 2M -e 16G -f 2 -n 10 -g 1 -w 10", "", "#"] + HDR_NEW + rows, exp, "")
# 22 nccl-tests#176: 128 GPUs, old error layout with 1e-06 deviations, header only
rows, exp = table("x", "all_reduce", 128, [4096 << k for k in range(0, 16, 3)], 93.0, 40.0, layout="old_redop", wrong="1e-06", tfmt=old_t)
write("22_old_128gpus_error_column.log", "all_reduce", 128, HDR_OLD + rows, exp, "")
# 23 nccl-tests#287: alltoall on one GPU; the in-place time below 1 us gives an algbw wider than its column
write("23_alltoall_one_rank_wide_algbw.log", "alltoall", 1, ["user@box:~/nccl-tests$ ./build/alltoall_perf"] + pre(1, 1, "NVIDIA GeForce RTX 5090", ["box"], 1, minb=33554432, maxb=33554432) + HDR_NEW +
      ["    33554432       8388608     float    none      -1    19.71  1702.44    0.00      0     0.81  41425.22    0.00    N/A", "# Out of bounds values : 0 OK", "# Avg bus bandwidth    : 0 ", "#"],
      [[33554432, [[19.71, 1702.44, 0.0], [0.81, 41425.22, 0.0]]]], "")
# 24 nccl-tests#119: -i step sizes (not powers of two)
rows, exp = table("x", "all_reduce", 4, [23068680 + 1048576 * k for k in range(6)], 20.0, 45.0)
write("24_linear_steps.log", "all_reduce", 4, ["./build/all_reduce_perf -b 23068680 -e 28311560 -i 1048576 -g 4"] + HDR_NEW + rows, exp, "")
# 25 nccl-tests#167: -o all: max and min rows in one table
rows, exp = table("x", "all_reduce", 2, [196608 + 1024 * k for k in range(4)], 40.0, 2.4, redops=["max", "min"], tfmt=old_t)
write("25_several_redops.log", "all_reduce", 2, ["./all_reduce_perf -b 192K -e 200K -i 1024 -o all -g 2"] + HDR_NEW + rows, exp, "")
# 26 microsoft/mscclpp#646: a web page escaped the '#' ('\#'); f8e4m3 and bfloat16 types under mpirun -np 8
rows1, exp1 = table("x", "all_reduce", 8, [1024 << k for k in range(0, 7, 2)], 9.0, 60.0, dtype="f8e4m3")
rows2, exp2 = table("x", "all_reduce", 8, [1024 << k for k in range(0, 7, 2)], 9.0, 60.0, dtype="bfloat16")
write("26_escaped_hashes_fp8_types.log", "all_reduce", 8, ["> mpirun -np 8 --bind-to numa ./build/all_reduce_perf -b 1K -e 64K -f 2 -d f8e4m3 -G 1 -w 10 -n 100 -c 1", ""] + ["\\" + h for h in HDR_NEW] + rows1 + rows2, exp1 + exp2, "")
# 27 microsoft/NPKit#19: four processes on one host (mpirun, one Pid each), old error layout
rows, exp = table("x", "all_reduce", 4, [8 << k for k in range(0, 22, 3)], 33.0, 9.5, layout="old_redop", wrong="3e-08", tfmt=old_t)
write("27_four_pids_old_layout.log", "all_reduce", 4, pre(4, 1, "NVIDIA GeForce RTX 2080 Ti", ["gpu9"], 4, group=False, maxb=33554432, extra="validation: 1") + HDR_OLD + rows, exp, "")
# 28 Azure/msccl#42: mpirun -np 8 ... -g 1 with --output-filename, eight Pids
rows, exp = table("x", "all_reduce", 8, [128 << k for k in range(0, 23, 3)], 18.0, 120.0)
write("28_mpirun_np8_g1_eight_pids.log", "all_reduce", 8, ["me@vm:~$ mpirun -np 8 --output-filename out --merge-stderr-to-stdout -x NCCL_ALGO=RING /opt/msccl-tests/build/all_reduce_perf -b 128 -e 1GB -f 2 -g 1 -c 1 -n 5 -w 3"] + pre(8, 1, "Tesla V100-SXM2-32GB", ["vm"], 8, minb=128, maxb=1073741824) + HDR_NEW + rows, exp, "")
# 29 nccl-tests b188a15 (2017, src/common.cu and all_reduce.cu): 'bytes N type op' header, time in ms, 'res'
ms_rows, ms_exp = [], []
for size in [1048576 << k for k in range(4)]:
    t = 50.0 + size / 9e3
    alg = size / t / 1e3
    ms = "%7.3f" % (t / 1e3)
    a_, b_ = "%5.2f" % alg, "%5.2f" % (alg * 1.5)
    ms_rows.append(f"{size:12d}  {size // 4:12d}   float     sum  {ms}  {a_}  {b_}  1e-07  {ms}  {a_}  {b_}  1e-07")
    ms_exp.append([size, [[float(ms) * 1e3, float(a_), float(b_)]] * 2])
write("29_2017_layout_time_in_ms.log", "all_reduce", 4, ["# Using devices", "#   Rank  0 on     dgx-1 device  0 [0x06] Tesla P100-SXM2-16GB",
      "#                                                  out-of-place                    in-place",
      "#      bytes             N    type      op     time  algbw  busbw      res     time  algbw  busbw      res"] + ms_rows, ms_exp, "")
# 30 srun --label ('3: ') with a bare '[0]' glued into the middle of a row
rows, exp = table("x", "all_reduce", 4, [1048576 << k for k in range(4)], 20.0, 30.0)
rows = ["0: " + r for r in rows]
rows[1] = rows[1].replace("      -1    ", "      -1[0] ", 1)
rows[2] = rows[2].replace("    sum      -1", "    sum      -1[1,0]<stdout>:", 1)
write("30_srun_label_bracket_glued.log", "all_reduce", 4, ["0: srun -N 1 -n 4 ./build/all_reduce_perf_mpi -b 1M -e 8M -f 2 -g 1"] + ["0: " + h for h in HDR_NEW] + rows, exp, "")
# 31 -C 1: cputime columns (src/util.cu): time is host time, algbw still from the GPU time
rows, exp = table("x", "reduce_scatter", 4, [1048576 << k for k in range(3)], 20.0, 30.0)
rows = [r[:45] + r[45:].replace(r.split()[5], "%7.2f" % (float(r.split()[5]) + 3.1), 1) for r in rows]
write("31_cputime_columns.log", "reduce_scatter", 4, ["./build/reduce_scatter_perf -b 1M -e 4M -f 2 -g 4 -C 1", HDR_NEW[0], HDR_NEW[1].replace("    time", " cputime"), HDR_NEW[2]] + rows,
      [[s, [[round(h[0][0] + 3.1, 2), h[0][1], h[0][2]], h[1]]] for s, h in exp], "")
json.dump(EXPECT, open(os.path.join(OUT, "expected.json"), "w"), indent=1)
print(len(EXPECT))
for name, n in (("07_old_all_reduce_64ranks.log", 64), ("22_old_128gpus_error_column.log", 128)):
    EXPECT[name].update(world_size=None, nranks=n)  # 2-decimal bandwidths cannot tell N from N + 1
json.dump(EXPECT, open(os.path.join(OUT, "expected.json"), "w"), indent=1)
