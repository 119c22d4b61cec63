"""Which path did NCCL take? Read the connection lines of `NCCL_DEBUG=INFO` output.

When a communicator starts, NCCL logs one line per connection it sets up, e.g.

    host:4242:4290 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read
    host:4242:4290 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[1] via SHM/direct/direct
    node-a:77:91 [1] NCCL INFO Channel 02/0 : 1[1] -> 2[0] [send] via NET/IB/0/GDRDMA
    gpu:2101:2140 [0] NCCL INFO Channel 00 : 0[1a000] -> 1[1b000] via P2P/IPC        (older NCCL)

"Channel CC[/K]" is the channel (K, printed by newer NCCL, is the connection index on it);
"a[x] -> b[y]" the sending and receiving rank, with in brackets the device number (newer NCCL)
or the GPU's PCI bus id in hex (older NCCL, e.g. 1a000 for 0000:1a:00.0); "[send]"/"[receive]"
says which side logged a network connection (both sides do); "via T" is the transport, kept
exactly as NCCL printed it, spaces and all ("P2P/direct pointer/read", "NET/AWS Libfabric/0/GDRDMA").
Older NCCL says "Ring" instead of "Channel". CollNet (in-network reduction) logs one rank per line,
"CollNet 00/0 : 3 [send] via COLLNET/SHARP/0"; it is read as a row with the other rank None.

Real logs are messy: ranks interleave, launchers prefix lines (`[rank0]:`, `0: `,
`[1,0]<stdout>:`, timestamps), warnings come in between, a line can be glued to the end of
another, and the same connection can be logged twice (a send and its receive, or a ring
connection again when the trees connect). `parse_connections` finds each connection line
anywhere in a line, and keeps one row per connection (channel, index, source, destination),
whatever the order of the lines. It never raises on text; `read_connections` reads a file and
raises LabInputError (missing file, a directory, no connection line at all).

What the transports mean, and what NCCL_P2P_DISABLE, NCCL_P2P_LEVEL and NCCL_SHM_DISABLE
change, is in `transport_meaning` and `settings_table` (from NCCL's environment-variable docs);
`path_kind` says whether a connection went GPU to GPU, through host memory or over the network.

How NCCL picks the transport of a connection (read in NCCL 2.30.7's source, src/transport.cc,
src/graph/paths.cc, src/transport/p2p.cc and shm.cc): it asks the transports in a fixed order, P2P,
SHM, NET (then CollNet), and takes the first whose `canConnect` accepts the pair. `p2pCanConnect`
calls `ncclTopoCheckP2p`, which compares the path type between the two GPUs (LOC < NVL < NVB < C2C
< PIX < PXB < P2C < PXN < PHB < SYS) with a level: PATH_PXB by default (through PCIe switches, never
through a CPU's host bridge), PATH_SYS on x86 AMD CPUs when the system holds at most two GPUs, and
whatever NCCL_P2P_LEVEL says when it is set (NCCL_P2P_DISABLE=1 means LOC). A pair within the level
must also have NVML report P2P read and write as OK (on NVLink a refusal is an error), then
`ncclTopoCheckNet` may prefer the network, and `cudaDeviceCanAccessPeer` must say yes: the driver
decides whether peer access exists at all (GeForce cards get none over PCIe).
When P2P is ruled out, `shmCanConnect` accepts any two ranks on one host that share /dev/shm,
unless NCCL_SHM_DISABLE=1: the bytes go through a buffer in host memory, still copied by NCCL's GPU
kernels. NCCL up to 2.22 defaulted to PATH_SYS and lowered it to PXB on Intel, ARM and Zhaoxin
CPUs. P2P's `/read` suffix (the receiver pulls) is the default only on NVLink between GPUs of compute
capability 8.0 (A100); NCCL_P2P_READ_ENABLE changes it.
"""

from __future__ import annotations

import os
import re
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd

from labutils.core.inputs import LabInputError
from labutils.core.results import DATA_DIR, to_json
from labutils.readers.sources import read_text

SAMPLES_DIR = DATA_DIR / "nccl_debug"

# The transport after "via", in the forms NCCL's source prints (src/transport/*.cc, 2.4 to 2.30):
#   P2P/IPC, P2P/CUMEM, P2P/MNNVL, P2P/direct pointer, P2P/common device (2.4-2.7), then /read and /CE;
#   P2P/indirect/<rank>[<dev>] (through an intermediate GPU), then /read;
#   SHM/direct/direct, SHM/CE/direct (2.12-2.27), SHM/direct (2.28+), "direct shared memory" (2.4-2.12);
#   NET/<plugin>/<dev>[(<proxy rank>)][/GDRDMA][(PCI)][/Shared], the plugin's name as it gives it, spaces
#   included ("IB", "Socket", "IBext_v8", "AWS Libfabric", "OFI");
#   COLLNET/<plugin>/<dev>[/GDRDMA][(PCI)] on the one-rank CollNet lines.
# What follows the transport (RCCL appends "comm 0x... nRanks N") is not part of it.
_PLUGIN = r"[^/\[\]\s](?:[^/\[\]\n]{0,60}?[^/\[\]\s])?"
_SUFFIX = r"(?:/[A-Za-z]\w{0,20}|\((?:PCI|\d{1,6})\))*"
_TRANSPORT = (r"(?:direct shared memory"
              r"|P2P/(?:direct pointer|common device|indirect/\d{1,6}(?:\[[0-9a-fA-F]{1,16}\])?|[A-Za-z]\w{0,20})"
              + _SUFFIX +
              r"|(?:NET|COLLNET)/" + _PLUGIN + r"/\d{1,4}" + _SUFFIX +
              r"|[A-Za-z][^\s\[\]]{0,80})")
# "Channel 00/0 : 0[0] -> 1[1] [send] via NET/IB/0/GDRDMA"; old NCCL: "Ring 00 : 0[1000] -> 1[2000] via P2P/IPC".
_CONNECTION = re.compile(
    r"\b(?:Channel|Ring) +(\d{1,3})(?:/(\d{1,2}))? *: *(\d{1,6})(?:\[([0-9a-fA-F]{1,16})\])? *-> *"
    r"(\d{1,6})(?:\[([0-9a-fA-F]{1,16})\])? *(?:\[(send|receive)\] *)?via +(" + _TRANSPORT + ")")
# One rank's connection to CollNet (in-network reduction), no "->": "CollNet 00/0 : 3 [send] via COLLNET/SHARP/0";
# NCCL 2.12-2.17 "CollNet 00 : 3 [send] via ...", 2.7-2.11 "Coll 00 : 3 [receive] via ...".
_COLLNET = re.compile(r"\bColl(?:Net)? +(\d{1,3})(?:/(\d{1,2}))? *: *(\d{1,6}) *\[(send|receive)\] *via +("
                      + _TRANSPORT + ")")
_TRAILING = "`'\",;."  # what a pasted line carries after the transport (markdown, quotes, prose)
# The ring order of a channel, printed once at start-up: "Channel 00/02 :    0   1   2   3".
_RING_ORDER = re.compile(r"\b(?:Channel|Ring) +(\d{1,3})(?:/\d{1,3})? *:((?: +\d{1,6}){2,}) *$")

COLUMNS = ["channel", "conn", "src_rank", "dst_rank", "ring", "src_at", "dst_at", "at", "transport", "family",
           "logged", "receive_transport"]


@dataclass(frozen=True)
class Connection:
    """One connection NCCL set up: channel (and index on it, None when not printed), source and
    destination rank, the bracket text after each rank (`src_at`, `dst_at`: device number or PCI
    bus id, see `at`), the transport as printed, its `family` (P2P, SHM, NET/IB, NET/Socket, ...),
    which sides logged it ("send", "receive", "send+receive", or "" for a one-sided P2P/SHM line)
    and, when the receiving side printed a different transport string (another NIC), that string.
    `ring` is True when the connection joins neighbours of the channel's ring order (also logged
    at start-up), False when it does not (a tree or point-to-point connection), None when the log
    holds no ring order for that channel. A CollNet row (NCCL's "CollNet 00/0 : 3 [send] via
    COLLNET/...", one rank and the network's in-switch reduction) has `dst_rank` None on its send
    side and `src_rank` None on its receive side, and family "COLLNET".
    """

    channel: int
    conn: int | None
    src_rank: int | None
    dst_rank: int | None
    ring: bool | None
    src_at: str | None
    dst_at: str | None
    at: str
    transport: str
    family: str
    logged: str
    receive_transport: str | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def bracket_kind(src_at: str | None, dst_at: str | None = None) -> str:
    """"device" when the brackets hold device numbers (newer NCCL), "bus id" when they hold PCI
    bus ids (older NCCL: hex, usually 4+ digits such as 1a000), "" when there are none."""
    values = [v for v in (src_at, dst_at) if v]
    if not values:
        return ""
    if any(re.search(r"[a-fA-F]", v) or len(v) >= 4 for v in values):
        return "bus id"
    return "device"


def transport_family(transport: str) -> str:
    """The kind of path: P2P, SHM, NET/IB, NET/Socket, NET (another plugin), COLLNET, or other."""
    t = transport.strip()
    if t.startswith("P2P"):
        return "P2P"
    if t.startswith("SHM") or t == "direct shared memory":
        return "SHM"
    if t.startswith("NET/IB"):
        return "NET/IB"
    if t.startswith("NET/Socket"):
        return "NET/Socket"
    if t.startswith("NET"):
        return "NET"
    if t.upper().startswith("COLLNET"):
        return "COLLNET"
    return "other"


_MEANING = {
    "P2P": "GPU to GPU directly (NVLink or PCIe peer access): one GPU reads or writes the other's memory",
    "SHM": "staged through a buffer in host memory shared by the two processes: NCCL ruled P2P out for the "
           "pair (a path beyond NCCL's P2P level, or no peer access from the driver)",
    "NET/IB": "over the network with InfiniBand/RoCE verbs (RDMA); GDRDMA means the NIC reads and writes "
              "GPU memory directly (GPUDirect RDMA)",
    "NET/Socket": "over the network with TCP sockets, staged through host memory (the slowest path)",
    "NET": "over the network through a plugin (e.g. AWS OFI or a vendor's IB plugin)",
    "COLLNET": "through in-network reduction (e.g. SHARP switches)",
    "other": "a transport this reader does not know; see NCCL's documentation",
}
_DETAILS = (("/CUMEM", "memory shared with CUDA's cuMem* API (newer NCCL)"),
            ("/IPC", "memory shared with CUDA IPC handles between processes"),
            ("direct pointer", "one process drives both GPUs and uses the pointer directly"),
            ("/read", "the receiver reads from the sender's memory rather than the sender writing"),
            ("/indirect", "relayed through an intermediate GPU"),
            ("/GDRDMA", "GPUDirect RDMA"),
            ("/CE", "the copies made by the GPU's copy engines (NCCL_P2P_USE_CUDA_MEMCPY, SHM's CE)"),
            ("/MNNVL", "NVLink between nodes (multi-node NVLink)"),
            ("common device", "both ranks drive one GPU"),
            ("(PCI)", "GPUDirect RDMA through a PCIe path NCCL rates lower"),
            ("/Shared", "network buffers shared between connections"))


_PATH_KIND = {"P2P": "direct", "SHM": "host memory", "NET/IB": "network", "NET/Socket": "network", "NET": "network",
              "COLLNET": "network"}
PATH_KINDS = ("direct", "host memory", "network")


def path_kind(transport: str) -> str:
    """Which way the bytes went: "direct" (GPU to GPU, P2P), "host memory" (SHM), "network" (NET,
    COLLNET), or "" for a transport this reader does not know."""
    return _PATH_KIND.get(transport_family(transport), "")


def transport_meaning(transport: str) -> str:
    """One sentence on what a transport string means, e.g. 'P2P/CUMEM/read' or 'NET/Socket/0'."""
    family = transport_family(transport)
    extra = [text for key, text in _DETAILS if key in transport and not (key == "/GDRDMA" and family == "NET/IB")]
    return f"{family}: {_MEANING[family]}" + (f"; here {', '.join(extra)}" if extra else "")


COLLNET = "CollNet"  # how a CollNet row's missing rank is shown: the rank talks to the network's reduction


def _line_matches(line: str):
    """(channel, conn, src, src_at, dst, dst_at, side, transport) for each connection in one line; a
    CollNet line has src (its [send] side) or dst (its [receive] side) None."""
    for m in _CONNECTION.finditer(line):
        *head, transport = m.groups()
        yield (*head, transport.rstrip(_TRAILING))
    for m in _COLLNET.finditer(line):
        channel, conn, rank, side, transport = m.groups()
        src, dst = (rank, None) if side == "send" else (None, rank)
        yield channel, conn, src, None, dst, None, side, transport.rstrip(_TRAILING)


def _matches(text: str):
    for line in text.splitlines():
        yield from _line_matches(line)


def _rank_key(rank: int | None) -> int:
    return -1 if rank is None else rank


def _rank_text(rank: int | None) -> str:
    return COLLNET if rank is None else str(rank)


def ring_orders(text) -> dict[int, tuple[int, ...]]:
    """Channel -> the ranks of its ring in order, from the start-up lines "Channel 00/02 :  0 1 2 3".

    Each ring sends from every rank to the next one and from the last back to the first. A
    channel printed with two different orders (two communicators in one log) is left out.
    """
    if not isinstance(text, str):
        return {}
    found: dict[int, set] = {}
    for line in text.splitlines():
        m = _RING_ORDER.search(line)
        if m:
            found.setdefault(int(m.group(1)), set()).add(tuple(int(v) for v in m.group(2).split()))
    return {c: next(iter(orders)) for c, orders in sorted(found.items()) if len(orders) == 1}


def _in_ring(order: tuple | None, src: int | None, dst: int | None) -> bool | None:
    if order is None:
        return None
    return any(order[i] == src and order[(i + 1) % len(order)] == dst for i in range(len(order)))


def parse_connections(text) -> list[Connection]:
    """One Connection per (channel, index, source, destination) in NCCL_DEBUG=INFO text, sorted.

    Lines may come in any order and carry any prefix; duplicates collapse. When the two sides of
    a network connection both logged it, `transport` is the sending side's string and
    `receive_transport` the receiving side's when it differs. Never raises on a str; anything
    else gives an empty list.
    """
    if not isinstance(text, str):
        return []
    seen: dict[tuple, dict] = {}
    for channel, conn, src, src_at, dst, dst_at, side, transport in _matches(text):
        key = (int(channel), None if conn is None else int(conn), None if src is None else int(src),
               None if dst is None else int(dst))
        entry = seen.setdefault(key, {"send": set(), "receive": set(), "at": set()})
        entry["receive" if side == "receive" else "send"].add(transport)
        entry.setdefault("sides", set()).add(side or "")
        entry["at"].add((src_at, dst_at))
    rings = ring_orders(text)
    rows = []
    for (channel, conn, src, dst), entry in seen.items():
        sends, receives = sorted(entry["send"]), sorted(entry["receive"])
        transport = sends[0] if sends else receives[0]
        receive = receives[0] if sends and receives and receives[0] != transport else None
        sides = entry["sides"]
        logged = "+".join(s for s in ("send", "receive") if s in sides) or ""
        src_at, dst_at = min(entry["at"], key=lambda pair: tuple(v or "" for v in pair))
        rows.append(Connection(channel, conn, src, dst, _in_ring(rings.get(channel), src, dst), src_at, dst_at,
                               bracket_kind(src_at, dst_at), transport, transport_family(transport), logged, receive))
    return sorted(rows, key=lambda c: (c.channel, -1 if c.conn is None else c.conn, _rank_key(c.src_rank),
                                       _rank_key(c.dst_rank)))


def read_connections(path) -> list[Connection]:
    """The connections of a log file (see parse_connections).

    LabInputError naming the file when it cannot be read (`sources.read_text`) or holds no connection
    line (then NCCL_DEBUG was not INFO, or the communicator never started).
    """
    text = read_text(path, "LOG", "; give the log file written with NCCL_DEBUG=INFO")
    rows = parse_connections(text)
    if not rows:
        raise LabInputError(f"LOG={str(path)!r} holds no NCCL connection line ('Channel 00/0 : 0[0] -> 1[1] via ...'); "
                            "run with NCCL_DEBUG=INFO and keep the communicator's start-up output")
    return rows


def connections_frame(rows: list[Connection]) -> pd.DataFrame:
    """The rows as a DataFrame with COLUMNS."""
    return pd.DataFrame([r.as_dict() for r in rows], columns=COLUMNS)


def summary(rows: list[Connection]) -> pd.DataFrame:
    """Per transport as printed: how many connections, on how many channels, between which ranks
    ("3->CollNet" for a CollNet row), and what it means."""
    out = []
    for transport in sorted({r.transport for r in rows}):
        part = [r for r in rows if r.transport == transport]
        pairs = sorted({(r.src_rank, r.dst_rank) for r in part}, key=lambda p: (_rank_key(p[0]), _rank_key(p[1])))
        out.append({"transport": transport, "family": part[0].family, "connections": len(part),
                    "channels": len({r.channel for r in part}),
                    "rank pairs": ", ".join(f"{_rank_text(a)}->{_rank_text(b)}" for a, b in pairs),
                    "meaning": transport_meaning(transport)})
    return pd.DataFrame(out, columns=["transport", "family", "connections", "channels", "rank pairs", "meaning"])


def connection_lines(path, channel: int = 0) -> list[str]:
    """The lines of a log file that set up a connection on `channel`, as logged (prefixes kept), each once."""
    lines = read_text(path, "LOG", "; give the log file written with NCCL_DEBUG=INFO").splitlines()
    found = [line.rstrip() for line in lines if any(int(m[0]) == channel for m in _line_matches(line))]
    return list(dict.fromkeys(found))


def samples() -> list[Path]:
    """The lab's sample logs (data/nccl_debug/*.log), by name."""
    return sorted(SAMPLES_DIR.glob("*.log"))


def ring_transports(rows: list[Connection]) -> str:
    """The transports of the ring connections, e.g. "P2P/CUMEM/read (4), NET/IB/0/GDRDMA (2)";
    all connections when the log gave no ring order."""
    chosen = [r for r in rows if r.ring] or [r for r in rows if r.ring is None]
    counts: dict[str, int] = {}
    for r in chosen:
        counts[r.transport] = counts.get(r.transport, 0) + 1
    return ", ".join(f"{t} ({n})" for t, n in sorted(counts.items()))


def samples_overview() -> pd.DataFrame:
    """One row per sample log: what it shows (from its header), connections, and the ring's transports."""
    out = []
    for path in samples():
        rows = read_connections(path)
        header = [line.split("#", 1)[1].strip() for line in path.read_text(encoding="utf-8").splitlines()[:4]
                  if "#" in line and "SAMPLE" not in line]
        out.append({"sample": path.name, "about": " ".join(header), "connections": len(rows),
                    "ring connections use": ring_transports(rows)})
    return pd.DataFrame(out).set_index("sample")


@contextmanager
def capture(directory, subsystems: str = "INIT"):
    """Make every process started inside the block log NCCL's start-up to files in `directory`.

    Sets NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=`subsystems` and NCCL_DEBUG_FILE=directory/nccl.%h.%p.log
    (NCCL puts the host name and process id in place of %h and %p) for the block, then restores
    the environment. Yields a function returning all those files' text, concatenated. Only
    processes started inside the block see the variables (the lab's launcher starts fresh ones).
    """
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    wanted = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": subsystems,
              "NCCL_DEBUG_FILE": str(folder / "nccl.%h.%p.log")}
    saved = {k: os.environ.get(k) for k in wanted}
    os.environ.update(wanted)

    def text() -> str:
        return "\n".join(p.read_text(encoding="utf-8", errors="replace") for p in sorted(folder.glob("nccl.*.log")))

    try:
        yield text
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


# --- the settings that move NCCL off a path ---

SETTINGS = (
    {"variable": "NCCL_P2P_DISABLE", "values": "1",
     "what it changes": "turns off the P2P transport (direct GPU-to-GPU access over NVLink or PCIe)",
     "what the log then shows": "former P2P/... connections inside a node become SHM/... (or NET/... when SHM "
                                "is off too)"},
    {"variable": "NCCL_P2P_LEVEL", "values": "LOC, NVL, PIX, PXB, PHB, SYS",
     "what it changes": "the farthest GPU pair that may still use P2P: LOC never, NVL only over NVLink, PIX on "
                        "one PCIe switch, PXB across PCIe switches, PHB through the host bridge of one NUMA "
                        "node, SYS also across CPU sockets; unset: PXB (SYS on AMD CPUs with at most two GPUs, "
                        "NCCL 2.23 and later), and the driver must still allow peer access",
     "what the log then shows": "pairs farther apart than the level switch from P2P/... to SHM/...; a higher "
                                "level can turn SHM back into P2P"},
    {"variable": "NCCL_SHM_DISABLE", "values": "1",
     "what it changes": "turns off the shared-host-memory transport used when P2P cannot be",
     "what the log then shows": "those connections go through the network transport instead: NET/Socket/... or "
                                "NET/IB/... even between GPUs of one machine"},
)


def settings_table() -> pd.DataFrame:
    """What NCCL_P2P_DISABLE, NCCL_P2P_LEVEL and NCCL_SHM_DISABLE change (source: NCCL's
    "Environment Variables" documentation), and how the change shows up in the connection lines."""
    return pd.DataFrame(list(SETTINGS)).set_index("variable")


# --- the command line ---

def format_rows(rows: list[Connection]) -> str:
    """The readable report of `python -m labutils nccl-transports LOG`."""
    width = max(len(r.transport) for r in rows)
    lines = [f"{'channel':>7} {'conn':>4}  {'src':>7} -> {'dst':<7} {'ring':<4}  {'transport':<{width}}  logged"]
    for r in rows:
        conn = "-" if r.conn is None else str(r.conn)
        ring = "?" if r.ring is None else "yes" if r.ring else "no"
        extra = f" (receiver printed {r.receive_transport})" if r.receive_transport else ""
        src, dst = _rank_text(r.src_rank), _rank_text(r.dst_rank)
        lines.append(f"{r.channel:>7} {conn:>4}  {src:>7} -> {dst:<7} {ring:<4}  {r.transport:<{width}}  "
                     f"{r.logged or 'one line'}{extra}")
    lines.append("")
    for row in summary(rows).itertuples(index=False):
        lines.append(f"{row.transport}: {row.connections} connection(s) on {row.channels} channel(s); "
                     f"{row.meaning}")
    kind = next((r.at for r in rows if r.at), "")
    if kind:
        held = "device numbers" if kind == "device" else "PCI bus ids (older NCCL)"
        lines.append(f"(brackets after the ranks hold {held})")
    return "\n".join(lines)


def _cli(args) -> int:

    rows = read_connections(args.log)
    print(to_json([r.as_dict() for r in rows]) if args.json else format_rows(rows))
    return 0


def add_cli(sub) -> None:
    """`python -m labutils nccl-transports LOG [--json]`."""
    p = sub.add_parser("nccl-transports",
                       help="which transport each NCCL connection used (from NCCL_DEBUG=INFO output)",
                       description="Read NCCL_DEBUG=INFO output and print one row per connection: channel, "
                                   "source and destination rank, and the transport exactly as NCCL printed it.")
    p.add_argument("log", help="a file holding NCCL_DEBUG=INFO output (any launcher prefixes are fine)")
    p.add_argument("--json", action="store_true", help="print the rows as a JSON list")
    p.set_defaults(func=_cli)
