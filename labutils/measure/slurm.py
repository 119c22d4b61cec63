"""SLURM: the rank a task of `srun` is, read from SLURM's variables; its hostlists; and a batch
script that runs the sweep across N nodes x G GPUs (`python -m labutils slurm-script`).

srun starts every task itself and sets, in each, SLURM_PROCID (the task's rank in the step),
SLURM_NTASKS (the step's tasks), SLURM_LOCALID (its rank on its node) and SLURM_NODEID (its node).
`slurm_env` turns them into the rank, world and local rank torchrun would have set, and finds the
rendezvous: MASTER_ADDR and MASTER_PORT when the environment has them, else the first host of the
step's node list (task 0 runs there: srun places tasks in blocks, first node first) and a port
derived from SLURM_JOB_ID (`job_port`), the same number in every task of the job without talking.
A job of one task (an interactive allocation, a notebook kernel started in a job) is no SLURM world:
it runs its own local ranks as on any machine.

Nothing here imports torch: the script generator runs on a login node in a fraction of a second.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess

from labutils.core.busbw import format_size, parse_size
from labutils.core.inputs import LabInputError, check_choice, check_int

MAX_HOSTS = 65_536  # a hostlist that expands further is a typo (node[1-99999999]), not a cluster
PORT_BASE, PORT_SPAN = 10_000, 20_000  # derived ports in [10000, 30000): below Linux's ephemeral range (32768+)
MODES = ("srun", "torchrun")
MAX_NODES, MAX_GPUS_PER_NODE = 4096, 64

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def _whole(name: str, raw: str, low: int, high: int | None = None) -> int:
    """A whole-number variable in [low, high]; LabInputError naming it otherwise."""
    text = raw.strip()
    if not text.isdigit() or len(text) > 9:
        raise LabInputError(f"{name}={raw!r} is not a whole number (srun sets it)")
    return check_int(name, int(text), low=low, high=high)


def _split_top(text: str) -> list[str]:
    """`text` split at the commas outside brackets: "a[1,3],b" -> ["a[1,3]", "b"]."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if depth not in (0, 1):
            raise ValueError("nested or unbalanced brackets")
        if ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError("an unclosed bracket")
    return parts + [text[start:]]


def _expand_one(item: str) -> list[str]:
    """One hostlist item, each bracket group a set of numbers or ranges (zero padding kept as written):
    "rack[1-2]-n[01-02]" -> rack1-n01, rack1-n02, rack2-n01, rack2-n02."""
    match = re.search(r"\[([^\]]*)\]", item)
    if match is None:
        if not item or "]" in item:
            raise ValueError(f"{item!r} is not a host name")
        return [item]
    head, tail, numbers = item[:match.start()], item[match.end():], []
    for part in match.group(1).split(","):
        found = _RANGE.match(part.strip())
        if found is None:
            raise ValueError(f"[{match.group(1)}] holds {part!r}, not a number or a range a-b")
        first, last = found.group(1), found.group(2) or found.group(1)
        if int(last) < int(first):
            raise ValueError(f"the range {part} runs backwards")
        if int(last) - int(first) >= MAX_HOSTS:
            raise ValueError(f"the range {part} holds more than {MAX_HOSTS} hosts")
        width = len(first) if first.startswith("0") else 0
        numbers += [str(n).zfill(width) for n in range(int(first), int(last) + 1)]
    rest = _expand_one(tail) if "[" in tail else [tail]
    return [f"{head}{n}{r}" for n in numbers for r in rest]


def expand_hostlist(text: str, name: str = "SLURM_JOB_NODELIST") -> list[str]:
    """The hosts of a SLURM hostlist, in order: "node[01-04,07]" -> node01 .. node04, node07;
    "a-[1-2],b3" -> a-1, a-2, b3. LabInputError naming `name` for what SLURM would not write."""
    try:
        hosts = [h for item in _split_top(str(text).strip()) for h in _expand_one(item.strip())]
        if len(hosts) > MAX_HOSTS:
            raise ValueError(f"it expands to more than {MAX_HOSTS} hosts")
    except ValueError as exc:
        raise LabInputError(f"{name}={text!r} is not a SLURM hostlist: {exc}") from None
    return hosts


def slurm_hosts(text: str, name: str = "SLURM_JOB_NODELIST") -> list[str]:
    """The hosts of a hostlist: `scontrol show hostnames` where scontrol exists and answers (it knows
    every form the site's SLURM writes), else `expand_hostlist`."""
    if shutil.which("scontrol"):
        try:
            run = subprocess.run(["scontrol", "show", "hostnames", text], capture_output=True, text=True, timeout=10)
            hosts = run.stdout.split()
            if run.returncode == 0 and hosts:
                return hosts
        except (OSError, subprocess.SubprocessError):
            pass
    return expand_hostlist(text, name)


def tasks_per_node(text: str, name: str = "SLURM_TASKS_PER_NODE") -> list[int]:
    """SLURM's compressed per-node task counts: "2(x3),1" -> [2, 2, 2, 1]; "4" -> [4]."""
    counts = []
    for part in str(text).split(","):
        found = re.fullmatch(r"\s*(\d{1,6})(?:\(x(\d{1,6})\))?\s*", part)
        if found is None:
            raise LabInputError(f"{name}={text!r} is not SLURM's per-node task count (such as 2(x3),1)")
        counts += [int(found.group(1))] * int(found.group(2) or 1)
        if len(counts) > MAX_HOSTS:
            raise LabInputError(f"{name}={text!r} names more than {MAX_HOSTS} nodes")
    return counts


def job_port(job_id: int) -> int:
    """The rendezvous port of SLURM job `job_id`: PORT_BASE + job_id mod PORT_SPAN, the same in every
    task of the job; two jobs sharing a first node get different ports unless their ids differ by a
    multiple of PORT_SPAN."""
    return PORT_BASE + int(job_id) % PORT_SPAN


def slurm_env(environ=None) -> dict | None:
    """This task's place in an srun step, or None when this is no SLURM world of several tasks.

    None when SLURM_PROCID, SLURM_NTASKS or SLURM_LOCALID is unset, when torchrun's RANK,
    WORLD_SIZE or LOCAL_RANK is set (torchrun under srun: its variables describe the ranks), or when
    the step has one task. Else {"rank", "world_size", "local_rank", "local_world_size", "node_rank",
    "nodes", "master_addr", "master_port", "job_id", "launcher": "srun"}. Inconsistent variables
    (PROCID >= NTASKS, LOCALID >= the tasks of this node, NODEID beyond the node count) are refused
    with a LabInputError naming them.
    """
    env = os.environ if environ is None else environ
    if not all(env.get(k, "").strip() for k in ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID")):
        return None
    if any(env.get(k, "").strip() for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK")):
        return None
    world = _whole("SLURM_NTASKS", env["SLURM_NTASKS"], low=1)
    if world == 1:
        return None
    rank = _whole("SLURM_PROCID", env["SLURM_PROCID"], low=0)
    if rank >= world:
        raise LabInputError(f"SLURM_PROCID={rank} is not below SLURM_NTASKS={world}: the task is outside its step")
    per_node = None
    for name in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
        if env.get(name, "").strip():
            per_node = tasks_per_node(env[name], name)
            break
    node = _whole("SLURM_NODEID", env["SLURM_NODEID"], low=0) if env.get("SLURM_NODEID", "").strip() else 0
    if per_node is not None and node >= len(per_node):
        raise LabInputError(f"SLURM_NODEID={node} is beyond the {len(per_node)} node(s) of SLURM_TASKS_PER_NODE")
    if env.get("SLURM_NTASKS_PER_NODE", "").strip():
        local_world, source = _whole("SLURM_NTASKS_PER_NODE", env["SLURM_NTASKS_PER_NODE"], low=1), \
            "SLURM_NTASKS_PER_NODE"
    elif per_node is not None:
        local_world, source = per_node[node], f"SLURM_TASKS_PER_NODE for node {node}"
    else:
        local_world, source = world, "SLURM_NTASKS"
    local_world = min(local_world, world)
    local = _whole("SLURM_LOCALID", env["SLURM_LOCALID"], low=0)
    if local >= local_world:
        raise LabInputError(f"SLURM_LOCALID={local} is not below the {local_world} task(s) per node of {source}")
    addr, port, job_id = _rendezvous(env)
    nodes = len(per_node) if per_node is not None else max(1, -(-world // local_world))
    return {"rank": rank, "world_size": world, "local_rank": local, "local_world_size": local_world,
            "node_rank": node, "nodes": nodes, "master_addr": addr, "master_port": port, "job_id": job_id,
            "launcher": "srun"}


def _rendezvous(env) -> tuple[str, int, int | None]:
    """MASTER_ADDR/MASTER_PORT from the environment, else the node list's first host and `job_port`."""
    raw_id = env.get("SLURM_JOB_ID", "").strip() or env.get("SLURM_JOBID", "").strip()
    job_id = _whole("SLURM_JOB_ID", raw_id, low=0) if raw_id else None
    addr = env.get("MASTER_ADDR", "").strip()
    if not addr:
        name = next((n for n in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
                     if env.get(n, "").strip()), None)
        if name is None:
            raise LabInputError("MASTER_ADDR is unset and so is SLURM_JOB_NODELIST: no host to meet at "
                                "(export MASTER_ADDR, or run under srun)")
        addr = slurm_hosts(env[name], name)[0]
    if env.get("MASTER_PORT", "").strip():
        port = master_port(env["MASTER_PORT"])
    elif job_id is not None:
        port = job_port(job_id)
    else:
        raise LabInputError("MASTER_PORT is unset and so is SLURM_JOB_ID: no port to meet at (export MASTER_PORT)")
    return addr, port, job_id


def master_port(raw: str) -> int:
    """MASTER_PORT as a TCP port in [1, 65535]; LabInputError naming it otherwise."""
    text = str(raw).strip()
    if not text.isdigit() or len(text) > 9:
        raise LabInputError(f"MASTER_PORT={raw!r} is not a whole number; the allowed range is [1, 65535]")
    return check_int("MASTER_PORT", int(text), low=1, high=65535)


# --- the batch script ----------------------------------------------------------------------------------

_PARTITION = re.compile(r"^[A-Za-z0-9_.\-]{1,64}(,[A-Za-z0-9_.\-]{1,64})*$")
_TIME = re.compile(r"^(?:(\d{1,3})-)?(\d{1,4})(?::(\d{1,2}))?(?::(\d{1,2}))?$")


def check_time(text: str) -> str:
    """A SLURM --time: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS, more than zero."""
    found = _TIME.match(str(text).strip())
    if found is None or all(int(g or 0) == 0 for g in found.groups()):
        raise LabInputError(f"time={text!r} is not a SLURM time limit (such as 30, 00:20:00 or 1-00:00:00)")
    return str(text).strip()


MIN_SCRIPT_BYTES, MAX_SCRIPT_BYTES = 1 << 10, 64 << 30  # the sweep starts at 1K; 3 buffers of 64G fill a large GPU


def _size_label(max_bytes) -> str:
    """`max_bytes` checked against [1K, 64G] and written as the sweep's --max-bytes reads it ("1G", else bytes)."""
    size = parse_size(max_bytes, "max_bytes")
    if not MIN_SCRIPT_BYTES <= size <= MAX_SCRIPT_BYTES:
        raise LabInputError(f"max_bytes={format_size(size)} is outside the allowed range [1K, 64G]")
    label = format_size(size)
    try:
        return label if parse_size(label) == size else str(size)
    except LabInputError:
        return str(size)


def slurm_script(nodes: int, gpus_per_node: int, partition: str | None = None, time: str = "00:20:00",
                 max_bytes: str | int = "1G", mode: str = "srun") -> str:
    """A batch script that sweeps all_reduce across `nodes` x `gpus_per_node` GPUs with NCCL.

    mode "srun": one task per GPU, each one rank (`slurm_env`); "torchrun": one task per node, each
    a torchrun that starts `gpus_per_node` ranks. Both first sweep one node alone (the intra-node
    busbw the network is set against, notebook 02's `multinode_result`), then every node; both
    results land in $LAB_RESULTS_DIR (default data/results/ of the checkout the job starts in).
    """
    nodes = check_int("nodes", nodes, low=1, high=MAX_NODES)
    gpus = check_int("gpus_per_node", gpus_per_node, low=1, high=MAX_GPUS_PER_NODE)
    check_choice("mode", mode, MODES)
    time = check_time(time)
    if partition is not None and not _PARTITION.match(str(partition)):
        raise LabInputError(f"partition={partition!r} is not a SLURM partition name (letters, digits, _ . -)")
    size = _size_label(max_bytes)
    sweep = f"-m labutils sweep --backend nccl --device cuda --max-bytes {shlex.quote(size)} --no-progress"
    per_rank = mode == "srun"
    lines = [
        "#!/bin/bash",
        f"# The Interconnect Lab: an all_reduce sweep across {nodes} node(s) x {gpus} GPU(s), "
        f"{'one srun task per GPU' if per_rank else 'one torchrun per node'}.",
        f"# Made by `python -m labutils slurm-script --nodes {nodes} --gpus-per-node {gpus} --mode {mode}`; "
        "submit it with `sbatch` from the lab's checkout.",
        "#SBATCH --job-name=lab-sweep",
        f"#SBATCH --nodes={nodes}",
        f"#SBATCH --ntasks-per-node={gpus if per_rank else 1}",
        f"#SBATCH --gpus-per-node={gpus}",
        f"#SBATCH --time={time}",
        *([f"#SBATCH --partition={partition}"] if partition else []),
        "#SBATCH --output=lab-sweep-%j.out",
        "set -euo pipefail",
        'cd "${SLURM_SUBMIT_DIR:-.}"  # the lab\'s checkout (sbatch starts here)',
        'export PYTHON="${PYTHON:-python}"  # the Python that has the lab and torch installed (a venv\'s bin/python)',
        'export LAB_RESULTS_DIR="${LAB_RESULTS_DIR:-$PWD/data/results}"  # both results land here',
        "",
        "# The rendezvous: the first node of the allocation, a port derived from the job id "
        f"({PORT_BASE} + id mod {PORT_SPAN}).",
        'export MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"',
        f'export MASTER_PORT="$(( {PORT_BASE} + SLURM_JOB_ID % {PORT_SPAN} ))"',
        "",
        f"# 1. One node alone: {gpus} local rank(s) of one task, the intra-node busbw.",
        f'srun --nodes=1 --ntasks=1 --gpus-per-node={gpus} "$PYTHON" {sweep} --nproc {gpus}',
        "",
    ]
    if per_rank:
        lines += [f"# 2. Every node: {nodes * gpus} tasks, one per GPU; each is the rank SLURM_PROCID says, "
                  "its GPU SLURM_LOCALID.",
                  f'srun --nodes={nodes} --ntasks={nodes * gpus} --ntasks-per-node={gpus} "$PYTHON" {sweep}']
    else:
        lines += [f"# 2. Every node: one torchrun per node, {gpus} rank(s) each; the node rank is each task's "
                  "own SLURM_NODEID.",
                  f"srun --nodes={nodes} --ntasks={nodes} --ntasks-per-node=1 bash -c '"
                  f'exec "$PYTHON" -m torch.distributed.run --nnodes={nodes} --nproc-per-node={gpus} '
                  '--node-rank="$SLURM_NODEID" --master-addr="$MASTER_ADDR" --master-port="$MASTER_PORT" '
                  f"{sweep}'"]
    lines += ["",
              'echo "results: the two newest sweep-*.json (+ .csv) in $LAB_RESULTS_DIR; give the one of '
              f'{nodes * gpus} ranks to notebook 02 (multinode_result) or to python -m labutils doctor --sweep"']
    return "\n".join(lines) + "\n"


def add_cli(subparsers) -> None:
    p = subparsers.add_parser("slurm-script", help="print a SLURM batch script that runs the sweep across nodes",
                              description="Print a batch script (sbatch) that sweeps all_reduce with NCCL on one "
                                          "node, then across every node; the results land in data/results/.")
    p.add_argument("--nodes", type=int, required=True, help=f"nodes to allocate (1..{MAX_NODES})")
    p.add_argument("--gpus-per-node", type=int, required=True, help=f"GPUs on each node (1..{MAX_GPUS_PER_NODE})")
    p.add_argument("--partition", default=None, help="the partition to submit to (default: the site's)")
    p.add_argument("--time", default="00:20:00", help="the job's time limit (default 00:20:00)")
    p.add_argument("--max-bytes", default="1G", help="largest message size, K/M/G 1024-based (default 1G)")
    p.add_argument("--mode", default="srun", choices=MODES,
                   help="srun: one task per GPU (default); torchrun: one torchrun per node")
    p.set_defaults(func=_cli_script)


def _cli_script(args) -> int:
    print(slurm_script(args.nodes, args.gpus_per_node, args.partition, args.time, args.max_bytes, args.mode), end="")
    return 0
