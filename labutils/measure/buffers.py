"""The buffers of one collective call, filled so that the exact result is known (notebook 02's
`#wrong` column): `fill` and `expected`, the call itself, and `count_wrong`, the correctness check
the sweep runs after timing each size. Runs inside the ranks (labutils.measure.harness).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from labutils.core.busbw import ROOTS, Layout, canonical_dtype


def torch_dtype(name: str):
    """The torch dtype for a name of DTYPES or an alias ('half' -> torch.float16)."""
    return getattr(torch, canonical_dtype(name))


def fill(rank: int, count: int, dtype: str, device: str = "cpu", offset: int = 0):
    """Deterministic input of `rank`: element i holds (offset + i) % 8 + rank + 1.

    Small integers, so sums over up to 8 ranks (at most 7*8 + 36 = 92) are exact in every
    dtype here, bfloat16 and int8 included: the expected result is known exactly.
    """
    idx = torch.arange(offset, offset + count, device=device, dtype=torch.int64)
    return (idx % 8 + rank + 1).to(torch_dtype(dtype))


def expected(lay: Layout, rank: int, device: str = "cpu"):
    """The exact result `rank` must hold after the collective on `fill`ed inputs."""
    n, dtype = lay.world_size, lay.dtype
    if lay.op == "all_reduce":
        idx = torch.arange(lay.count, device=device, dtype=torch.int64)
        return (n * (idx % 8) + n * (n + 1) // 2).to(torch_dtype(dtype))
    if lay.op == "reduce_scatter":
        idx = torch.arange(rank * lay.per_rank, (rank + 1) * lay.per_rank, device=device, dtype=torch.int64)
        return (n * (idx % 8) + n * (n + 1) // 2).to(torch_dtype(dtype))
    if lay.op == "all_gather":
        return torch.cat([fill(r, lay.per_rank, dtype, device) for r in range(n)])
    return fill(ROOTS["broadcast"], lay.count, dtype, device)


def make_buffers(lay: Layout, rank: int, device: str, filled: bool):
    """(input, output) tensors for one call; zeros when not `filled` (timing: sums stay finite)."""
    make = (lambda c: fill(rank, c, lay.dtype, device)) if filled else \
        (lambda c: torch.zeros(c, dtype=torch_dtype(lay.dtype), device=device))
    if lay.op == "all_gather":
        return make(lay.per_rank), torch.empty(lay.per_rank * lay.world_size, dtype=torch_dtype(lay.dtype),
                                               device=device)
    if lay.op == "reduce_scatter":
        return make(lay.per_rank * lay.world_size), torch.empty(lay.per_rank, dtype=torch_dtype(lay.dtype),
                                                                device=device)
    buf = make(lay.count)
    return buf, buf  # all_reduce and broadcast work in place


def collective_call(lay: Layout, inp, out):
    """A zero-argument function making one collective call of `lay.op` on these buffers."""
    if lay.op == "all_reduce":
        return lambda: dist.all_reduce(inp)
    if lay.op == "all_gather":  # torch >= 2.13 names it all_gather_single
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        return lambda: gather(out, inp)
    if lay.op == "reduce_scatter":
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        return lambda: scatter(out, inp)
    return lambda: dist.broadcast(inp, src=ROOTS["broadcast"])


def count_wrong(lay: Layout, ctx) -> int:
    """Fill, run the collective once, compare with `expected`; mismatches summed over ranks."""
    inp, out = make_buffers(lay, ctx.rank, ctx.device, filled=True)
    collective_call(lay, inp, out)()
    wrong = torch.tensor([int((out != expected(lay, ctx.rank, ctx.device)).sum().item())],
                         dtype=torch.int64, device=ctx.device)
    dist.all_reduce(wrong)
    return int(wrong.item())
