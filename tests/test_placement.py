"""CPU placement: the plan as a pure function of faked machines, and what a real spawned rank gets."""

import os
from pathlib import Path

import pytest
from rank_workers import affinity_worker

from labutils.core.inputs import LabInputError
from labutils.measure import placement as lab_cpus
from labutils.measure.placement import (
    MAX_THREADS_PER_RANK,
    check_local_ranks,
    machine_placement,
    max_local_ranks,
    plan_placement,
)


def write_sys_tree(root: Path, cores_per_socket: int, sockets: int = 2, smt: bool = False) -> Path:
    """A /sys tree as Linux lays out a `sockets`-socket machine: one NUMA node per socket, cores
    numbered socket by socket, SMT sibling of CPU i is i + (number of cores)."""
    cores = cores_per_socket * sockets
    system = root / "devices" / "system"
    node_cpus: dict[int, list[int]] = {}
    for core in range(cores):
        socket = core // cores_per_socket
        siblings = [core, core + cores] if smt else [core]
        for cpu in siblings:
            topo = system / "cpu" / f"cpu{cpu}" / "topology"
            topo.mkdir(parents=True)
            topo.joinpath("thread_siblings_list").write_text(",".join(map(str, siblings)) + "\n")
            topo.joinpath("physical_package_id").write_text(f"{socket}\n")
            node_cpus.setdefault(socket, []).append(cpu)
    for node, cpus in node_cpus.items():
        (system / "node" / f"node{node}").mkdir(parents=True)
        (system / "node" / f"node{node}" / "cpulist").write_text(lab_cpus.format_cpulist(cpus) + "\n")
    return root


MACHINES = [(cores, smt) for cores in (2, 16, 64, 96) for smt in (False, True)]


@pytest.fixture(scope="module")
def layouts(tmp_path_factory):
    out = {}
    for cores, smt in MACHINES:
        root = write_sys_tree(tmp_path_factory.mktemp(f"sys{cores}{'smt' if smt else ''}"), cores // 2, 2, smt)
        out[cores, smt] = lab_cpus.cpu_layout(str(root))
    return out


def test_layout_reads_cores_siblings_and_nodes(layouts):
    layout = layouts[16, True]
    assert ((layout.cpus, layout.sockets, len(layout.logical), layout.physical_cores, layout.smt)
            == (32, 2, 32, 16, True))
    by_cpu = {c.cpu: c for c in layout.logical}
    assert by_cpu[3].core == by_cpu[19].core == 3 and by_cpu[3].node == by_cpu[19].node == 0
    assert by_cpu[8].node == by_cpu[24].node == 1 and by_cpu[24].socket == 1
    assert [n.cpulist for n in layout.numa_nodes] == ["0-7,16-23", "8-15,24-31"]
    assert layouts[96, False].smt is False and layouts[96, False].physical_cores == 96
    assert layout.quota_cpus is None


def test_layout_keeps_only_the_allowed_cpus_and_reads_the_quota(tmp_path):
    root = write_sys_tree(tmp_path, 8, 2, smt=True)
    (root / "fs" / "cgroup").mkdir(parents=True)
    (root / "fs" / "cgroup" / "cpu.max").write_text("400000 100000\n")
    layout = lab_cpus.cpu_layout(str(root), allowed={0, 1, 16, 17, 9})
    assert sorted(c.cpu for c in layout.logical) == [0, 1, 9, 16, 17] and layout.physical_cores == 3
    assert layout.quota_cpus == 4.0
    (root / "fs" / "cgroup" / "cpu.max").write_text("max 100000\n")
    assert lab_cpus.cpu_quota(str(root)) is None
    v1 = root / "fs" / "cgroup" / "cpu" / "job"
    v1.mkdir(parents=True)
    v1.joinpath("cpu.cfs_quota_us").write_text("250000\n")
    v1.joinpath("cpu.cfs_period_us").write_text("100000\n")
    assert lab_cpus.cpu_quota(str(root), cgroup_text="3:cpu,cpuacct:/job\n0::/\n") == 2.5
    assert lab_cpus.parse_cpulist("0-2,8") == [0, 1, 2, 8] and lab_cpus.format_cpulist([8, 0, 2, 1]) == "0-2,8"


@pytest.mark.parametrize("cores, smt", MACHINES)
@pytest.mark.parametrize("nranks", [1, 2, 4, 8])
def test_plan_on_two_socket_machines(layouts, cores, smt, nranks):
    layout = layouts[cores, smt]
    plan = plan_placement(layout, nranks)
    core_of = {c.cpu: c.core for c in layout.logical}
    node_of = {c.cpu: c.node for c in layout.logical}
    assert plan.nranks == nranks and "\n" not in plan.explanation
    assert 1 <= plan.threads_per_rank <= MAX_THREADS_PER_RANK
    assert all(plan.threads_per_rank <= len(cpus) for cpus in plan.rank_cpus)  # never more threads than CPUs
    if cores < nranks:
        assert not plan.pinned and plan.threads_per_rank == 1 and "fewer cores than ranks" in plan.explanation
        return
    assert plan.pinned
    cores_of_rank = [{core_of[c] for c in cpus} for cpus in plan.rank_cpus]
    assert sum(map(len, cores_of_rank)) == len(set().union(*cores_of_rank))  # no physical core shared
    for cpus, own in zip(plan.rank_cpus, cores_of_rank):
        assert len(own) == plan.threads_per_rank  # one thread per physical core
        assert set(cpus) == {c for c in core_of if core_of[c] in own}  # SMT siblings go with their core
        assert len(cpus) == plan.threads_per_rank * (2 if smt else 1)
    per_node = cores // 2
    if (per_node // plan.threads_per_rank) * 2 >= nranks:  # every rank fits inside one node
        assert all(len({node_of[c] for c in cpus}) == 1 for cpus in plan.rank_cpus)
    if cores >= 8 and cores - 1 >= nranks:  # headroom on big machines
        assert plan.spare_cpus and len(set().union(*cores_of_rank)) < cores
    if (cores - (1 if cores >= 8 else 0)) // nranks > MAX_THREADS_PER_RANK:
        assert plan.threads_per_rank == MAX_THREADS_PER_RANK and "capped at 8" in plan.explanation


def test_plan_figures_for_the_lab_defaults(layouts):
    sixteen = plan_placement(layouts[16, False], 2)
    assert sixteen.threads_per_rank == 7 and sixteen.rank_cpus == (tuple(range(7)), tuple(range(8, 15)))
    assert sixteen.rank_nodes == ((0,), (1,)) and sixteen.spare_cpus == (7, 15)
    big = plan_placement(layouts[96, True], 2)  # packed: both ranks on node 0, 8 threads each
    assert big.threads_per_rank == 8 and big.rank_nodes == ((0,), (0,))
    assert big.rank_cpus[0] == tuple(range(8)) + tuple(range(96, 104))
    assert plan_placement(layouts[96, True], 2, threads_per_rank=20).threads_per_rank == 20  # the cap is overridable
    small = plan_placement(layouts[2, False], 2)
    assert small.threads_per_rank == 1 and small.rank_cpus == ((0,), (1,)) and small.spare_cpus == ()


def test_one_rank_baseline_gets_the_set_of_rank_0(layouts):
    for key in layouts:
        for n in (2, 4, 8):
            many = plan_placement(layouts[key], n)
            if not many.pinned:
                continue
            one = plan_placement(layouts[key], 1, threads_per_rank=many.threads_per_rank)
            assert one.rank_cpus[0] == many.rank_cpus[0] and one.threads_per_rank == many.threads_per_rank


def test_asked_threads_reserve_and_pinning_off(layouts):
    asked = plan_placement(layouts[16, False], 2, threads_per_rank=12)
    assert asked.threads_per_rank == 8 and "12 threads per rank were asked for, 8 fit" in asked.explanation
    assert plan_placement(layouts[16, False], 2, reserve_cores=0).threads_per_rank == 8
    assert plan_placement(layouts[16, False], 16).threads_per_rank == 1  # headroom never costs a rank its core
    off = plan_placement(layouts[16, False], 2, pin=False)
    assert not off.pinned and off.threads_per_rank == 7 and "LAB_PIN_CPU=0" in off.explanation
    assert off.rank_cpus[0] == tuple(range(16))


def test_quota_limits_the_threads(layouts):
    import dataclasses

    plan = plan_placement(dataclasses.replace(layouts[96, True], quota_cpus=4.0), 2)
    assert plan.threads_per_rank == 2 and "cgroup quota 4 CPUs" in plan.explanation
    starved = plan_placement(dataclasses.replace(layouts[96, False], quota_cpus=1.5), 2)
    assert not starved.pinned and starved.threads_per_rank == 1


def test_bad_input_names_the_value(layouts, monkeypatch):
    with pytest.raises(LabInputError, match="nranks=0"):
        plan_placement(layouts[16, False], 0)
    with pytest.raises(LabInputError, match="threads_per_rank=0"):
        plan_placement(layouts[16, False], 2, threads_per_rank=0)
    monkeypatch.setenv("LAB_THREADS_PER_RANK", "lots")
    with pytest.raises(LabInputError, match="LAB_THREADS_PER_RANK='lots'"):
        machine_placement(2)
    monkeypatch.setenv("LAB_THREADS_PER_RANK", "3")
    assert machine_placement(2, layout=layouts[16, False]).threads_per_rank == 3


def test_check_prints_the_plan_and_a_bad_setting_exits_2(monkeypatch, capsys):
    from labutils import cli

    assert cli.main(["check"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("CPU placement: ")]
    assert len(lines) == 1 and machine_placement(2).explanation in lines[0]
    monkeypatch.setenv("LAB_THREADS_PER_RANK", "0")
    assert cli.main(["check"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: LAB_THREADS_PER_RANK='0' must be a whole number >= 1"]


@pytest.mark.parametrize("cores, limit, oversubscribed", [(2, 8, 32), (16, 32, 256), (96, 192, 1536)])
def test_local_ranks_are_bounded_by_the_cores(cores, limit, oversubscribed, tmp_path):
    assert max_local_ranks(cores) == limit and max_local_ranks(cores, oversubscribe=True) == oversubscribed
    layout = lab_cpus.cpu_layout(str(write_sys_tree(tmp_path, cores_per_socket=cores // 2)), allowed=set(range(cores)))
    assert check_local_ranks(limit, layout, oversubscribe=False) == limit
    with pytest.raises(LabInputError, match=f"nproc={limit + 1} is outside the allowed range \\[1, {limit}\\]"):
        check_local_ranks(limit + 1, layout, oversubscribe=False)
    assert check_local_ranks(limit + 1, layout, oversubscribe=True) == limit + 1
    with pytest.raises(LabInputError, match="nproc"):
        check_local_ranks(oversubscribed + 1, layout, oversubscribe=True)


# --- real ranks on this machine ---------------------------------------------------------------

@pytest.mark.distributed
def test_spawned_ranks_get_their_planned_cpus_and_threads():
    from labutils.measure.pool import launch

    plan = machine_placement(2)
    layout = lab_cpus.cpu_layout()
    core_of = {c.cpu: c.core for c in layout.logical}
    got = launch(affinity_worker, 2, timeout_s=60)
    for r, rank in enumerate(got):
        assert rank["threads"] == plan.threads_per_rank
        assert rank["threads"] == len({core_of[c] for c in rank["cpus"]})  # one thread per physical core
        if not layout.smt:
            assert len(rank["cpus"]) == rank["threads"]
        if plan.pinned:
            assert rank["cpus"] == sorted(plan.rank_cpus[r])
    if plan.pinned:
        assert not set(got[0]["cpus"]) & set(got[1]["cpus"])
        # gloo's threads: own CPUs plus spare ones, never a single core (see labutils.measure.placement)
        assert all(len(rank["gloo_thread_cpus"]) >= 2 or len(layout.logical) == 1 for rank in got)


@pytest.mark.distributed
def test_pinning_off_and_the_baseline_placed_like_rank_0(monkeypatch):
    from labutils.measure.pool import launch

    everything = sorted(os.sched_getaffinity(0))
    baseline = launch(affinity_worker, 1, like_ranks=2, timeout_s=60)[0]
    two = machine_placement(2)
    assert baseline["threads"] == two.threads_per_rank
    assert baseline["cpus"] == (sorted(two.rank_cpus[0]) if two.pinned else everything)
    monkeypatch.setenv("LAB_PIN_CPU", "0")
    for rank in launch(affinity_worker, 2, timeout_s=60):
        assert rank["cpus"] == everything and rank["threads"] == two.threads_per_rank
    with pytest.raises(LabInputError, match="like_ranks=1"):
        launch(affinity_worker, 2, like_ranks=1)


# --- ranks on their GPU's NUMA node (two sockets, 8 GPUs split 4/4) ---------------------------------------

GPU_NODES_4_4 = (0, 0, 0, 0, 1, 1, 1, 1)


@pytest.mark.parametrize("smt", [False, True])
def test_ranks_sit_on_their_gpus_numa_node(layouts, smt):
    layout = layouts[96, smt]
    plan = plan_placement(layout, 8, gpu_nodes=GPU_NODES_4_4)
    node_of = {c.cpu: c.node for c in layout.logical}
    assert plan.threads_per_rank == 8 and plan.pinned
    for r, cpus in enumerate(plan.rank_cpus):
        assert {node_of[c] for c in cpus} == {GPU_NODES_4_4[r]} and plan.rank_nodes[r] == (GPU_NODES_4_4[r],)
        assert len(cpus) == 8 * (2 if smt else 1)
    assert len({c for cpus in plan.rank_cpus for c in cpus}) == sum(map(len, plan.rank_cpus))  # no CPU twice
    assert "8 rank(s) on their GPU's NUMA node" in plan.explanation
    # packed (node unknown) puts ranks 4 and 5 on node 0 too: 48 cores per node hold 6 ranks of 8 threads
    packed = plan_placement(layout, 8)
    assert [n for (n,) in packed.rank_nodes] == [0, 0, 0, 0, 0, 0, 1, 1]


def test_gpu_nodes_in_another_order_and_unknown_fall_back_to_packing(layouts):
    layout = layouts[96, False]
    crossed = plan_placement(layout, 8, gpu_nodes=(1, 0, 1, 0, 1, 0, 1, 0))
    assert [n for (n,) in crossed.rank_nodes] == [1, 0, 1, 0, 1, 0, 1, 0]
    assert crossed.rank_cpus[1] == tuple(range(8)) and crossed.rank_cpus[0] == tuple(range(48, 56))
    unknown = plan_placement(layout, 8, gpu_nodes=(-1,) * 8)
    assert unknown == plan_placement(layout, 8) == plan_placement(layout, 8, gpu_nodes=())
    # rank 0's GPU on node 1, the others unknown: rank 0 gets node 1's first cores, the rest pack from node 0
    mixed = plan_placement(layout, 2, gpu_nodes=(1, -1))
    assert mixed.rank_nodes == ((1,), (0,)) and mixed.rank_cpus[1] == tuple(range(8))
    # a node without room (all 8 GPUs on node 0, 8 x 8 cores > 48): the overflow packs onto node 1
    full = plan_placement(layout, 8, gpu_nodes=(0,) * 8)
    assert [n for (n,) in full.rank_nodes] == [0, 0, 0, 0, 0, 0, 1, 1]
    # a node this process may not use counts as unknown
    assert plan_placement(layout, 2, gpu_nodes=(7, 7)) == plan_placement(layout, 2)
