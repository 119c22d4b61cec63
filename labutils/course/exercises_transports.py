"""Grader of notebook 03 (NCCL's transports): which way did one connection of a log go?

The right answer comes from the lab's reader (labutils.readers.nccl_debug): the connection's
transport as NCCL printed it, and `path_kind` of it: "direct" (P2P, GPU to GPU), "host memory"
(SHM) or "network" (NET, COLLNET).
"""

from __future__ import annotations

from labutils.readers import nccl_debug

_HINT = ("The word after 'via' says it: P2P/... is GPU to GPU (\"direct\"), SHM/... a buffer in host memory "
         "(\"host memory\"), NET/... the network (\"network\", even NET/Socket, which stages through host memory "
         "on its way to the NIC).")


def check_path(answer, log, src_rank: int, dst_rank: int, channel: int = 0) -> str:
    """Notebook 03: which way the connection src_rank -> dst_rank on `channel` of the NCCL log `log` went:
    "direct", "host memory" or "network". A transport name (e.g. "SHM/direct/direct") is read as its
    family's way. Never raises: a log or connection that cannot be read gets one sentence."""
    try:
        rows = [r for r in nccl_debug.read_connections(log)
                if (r.channel, r.src_rank, r.dst_rank) == (channel, src_rank, dst_rank)]
    except Exception as exc:  # noqa: BLE001
        return f"The log cannot be graded ({exc})."
    if not rows:
        return f"The log holds no connection {src_rank} -> {dst_rank} on channel {channel}; check the ranks."
    transport = rows[0].transport
    right = nccl_debug.path_kind(transport)
    if not isinstance(answer, str) or not answer.strip():
        return f"Answer with one of {', '.join(repr(k) for k in nccl_debug.PATH_KINDS)}."
    given = answer.strip().lower()
    if given not in nccl_debug.PATH_KINDS:
        given = nccl_debug.path_kind(answer.strip()) or given
    if given not in nccl_debug.PATH_KINDS:
        return f"Not yet ({answer!r}): answer with one of {', '.join(repr(k) for k in nccl_debug.PATH_KINDS)}."
    where = f"channel {channel:02d}, {src_rank} -> {dst_rank} via {transport}"
    if given == right:
        return f"Right: {where}. {nccl_debug.transport_meaning(transport)}."
    return f"Not yet ({answer!r}): find the line of {src_rank} -> {dst_rank} on channel {channel:02d}. {_HINT}"
