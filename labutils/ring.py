"""Ring all-reduce by hand: the algorithm chunk by chunk, the bytes it sends, and a real one.

Reading order:
1. the simulation (`simulate_ring`): N ranks, each holding a buffer cut into N chunks. A
   reduce-scatter of N−1 steps, then an all-gather of N−1 steps. In reduce-scatter step s
   (s = 0 .. N−2) rank r sends chunk (r − s) mod N to its right neighbour r + 1, which adds it
   to its own copy; afterwards rank r holds the full sum of chunk (r + 1) mod N. In all-gather
   step s rank r sends chunk (r + 1 − s) mod N to r + 1, which overwrites its copy. Every
   intermediate state is kept as small integer arrays, with which ranks' inputs each chunk
   already holds, so a reader can follow every number; `draw_ring` draws one panel per step.
2. the bytes: every step each rank sends one chunk, size/N bytes, so over 2(N−1) steps a rank
   sends 2(N−1)/N · size bytes (and receives as many): nccl-tests' bus factor. Dividing the bytes
   each rank moves by the time gives busbw, a per-link rate comparable across N.
3. ring against tree: the α–β model. A ring is 2(N−1) steps in a row (N−1 each way), a binary
   tree about 2·log2 N (up, then down). The bandwidth term counts the bytes the busiest rank
   sends, from explicitly built trees: NCCL's *double* binary tree moves about 2·size per rank,
   the same as the ring, while a plain binary tree's inner ranks send 3·size (one copy up, two
   down). NCCL builds its trees across nodes; inside a node its ranks form a chain.
4. the real thing (`hand_ring_all_reduce`, `ring_worker`, `run_hand_ring`): the same algorithm
   with torch.distributed point-to-point `isend`/`recv` on N ranks (gloo on the CPU), checked
   element by element against `dist.all_reduce` on the same data and timed against it.

Everything in 1–3 is arithmetic on numbers; 4 is a measurement.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import numpy as np
import pandas as pd

from labutils.buffers import expected, fill
from labutils.busbw import bandwidths_GBps, bus_factor, canonical_dtype, element_bytes, layout
from labutils.fit import latency_term_us
from labutils.harness import agree_iters, warmup_iters
from labutils.inputs import LabInputError, check_choice, check_int, check_range
from labutils.launch import default_threads, launch
from labutils.plots import PALETTE, new_figure
from labutils.timing import across_ranks, time_loop

PHASES = ("reduce-scatter", "all-gather")


def _whole(name: str, value, low: int = 1, high: int | None = None) -> int:
    """check_int that also takes numpy integers (an N taken from an array)."""
    return check_int(name, value.item() if isinstance(value, np.generic) else value, low=low, high=high)
ALGORITHMS = ("ring", "tree", "double_tree")


# --- 1. the simulation ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Transfer:
    """One message of one step: `src` sends chunk `chunk` to `dst` (its right neighbour)."""

    src: int
    dst: int
    chunk: int


@dataclass(frozen=True)
class RingStep:
    """The ring after one step.

    `phase` is "reduce-scatter" or "all-gather", `index` counts from 1 within the phase and
    `number` from 1 over the whole all-reduce. `values[r]` is rank r's buffer after the step (a
    small integer array), `contributors[r, c]` says which ranks' inputs chunk c of rank r holds
    (booleans, one per rank).
    """

    phase: str
    index: int
    number: int
    transfers: tuple
    values: np.ndarray
    contributors: np.ndarray


@dataclass(frozen=True)
class RingRun:
    """A whole simulated ring all-reduce: the inputs, every step, and the chunk boundaries.

    `bounds[c]` is the (start, stop) of chunk c in every buffer; `expected` is the plain sum of
    the inputs, which every rank must hold at the end.
    """

    inputs: np.ndarray
    steps: tuple
    bounds: tuple

    @property
    def world_size(self) -> int:
        return int(self.inputs.shape[0])

    @property
    def expected(self) -> np.ndarray:
        return self.inputs.sum(axis=0)

    @property
    def result(self) -> np.ndarray:
        """Every rank's buffer at the end (N x length)."""
        return self.steps[-1].values if self.steps else self.inputs.copy()

    def is_correct(self) -> bool:
        """Every rank holds exactly the plain sum."""
        return bool(np.array_equal(self.result, np.broadcast_to(self.expected, self.result.shape)))

    def chunk_elements(self, chunk: int) -> int:
        start, stop = self.bounds[chunk]
        return stop - start

    def elements_sent(self) -> np.ndarray:
        """Elements each rank sent over the whole all-reduce (one entry per rank)."""
        sent = np.zeros(self.world_size, dtype=np.int64)
        for step in self.steps:
            for t in step.transfers:
                sent[t.src] += self.chunk_elements(t.chunk)
        return sent

    def elements_received(self) -> np.ndarray:
        received = np.zeros(self.world_size, dtype=np.int64)
        for step in self.steps:
            for t in step.transfers:
                received[t.dst] += self.chunk_elements(t.chunk)
        return received

    def bytes_sent(self, element_bytes: int = 4) -> np.ndarray:
        """Bytes each rank sent: elements_sent() x `element_bytes` (4 for float32)."""
        return self.elements_sent() * int(element_bytes)

    def table(self) -> pd.DataFrame:
        """One row per message: step, phase, sender, receiver, chunk, the numbers sent and the
        receiver's chunk after the step."""
        rows, before = [], self.inputs
        for step in self.steps:
            for t in step.transfers:
                shown = (lambda values: " ".join(map(str, _chunk(values, self.bounds, t.chunk).tolist())))  # noqa: B023 - called at once, in this iteration
                rows.append({"step": step.number, "phase": step.phase, "from rank": t.src, "to rank": t.dst,
                             "chunk": t.chunk, "sent": shown(before[t.src]),
                             "receiver's chunk after": shown(step.values[t.dst])})
            before = step.values
        return pd.DataFrame(rows)


def _chunk(buffer: np.ndarray, bounds, c: int) -> np.ndarray:
    start, stop = bounds[c]
    return buffer[start:stop]


def chunk_bounds(length: int, world_size: int) -> tuple:
    """(start, stop) of each of the N chunks of a buffer of `length` elements.

    The first `length mod N` chunks are one element longer, as numpy.array_split and
    torch.tensor_split cut them.
    """
    length = _whole("length", length, world_size)
    base, extra = divmod(length, world_size)
    bounds, start = [], 0
    for c in range(world_size):
        stop = start + base + (1 if c < extra else 0)
        bounds.append((start, stop))
        start = stop
    return tuple(bounds)


def digit_inputs(world_size: int = 4) -> np.ndarray:
    """Inputs whose sums can be read digit by digit: rank r holds (c + 1)·10^r in chunk c.

    A partial sum such as 330 in chunk 2 reads "3 from rank 1 and 3 from rank 2": the digits
    show which ranks' numbers are in it. For up to 6 ranks, so every number stays short.
    """
    n = _whole("world_size", world_size, 2, 6)
    return np.array([[(c + 1) * 10 ** r for c in range(n)] for r in range(n)], dtype=np.int64)


def small_inputs(world_size: int, chunk_elements: int = 1, seed: int = 0) -> np.ndarray:
    """Random small integers 0..9, N ranks x (N·chunk_elements), reproducible from `seed`."""
    n = _whole("world_size", world_size, 2)
    k = check_int("chunk_elements", chunk_elements, low=1)
    return np.random.default_rng(seed).integers(0, 10, size=(n, n * k), dtype=np.int64)


def ring_schedule(world_size: int) -> list[tuple[str, int, list[Transfer]]]:
    """The 2(N−1) steps of a ring all-reduce as (phase, index from 1, transfers), data-free.

    reduce-scatter step s: rank r sends chunk (r − s) mod N to (r + 1) mod N;
    all-gather step s: rank r sends chunk (r + 1 − s) mod N to (r + 1) mod N.
    """
    n = _whole("world_size", world_size, 1)
    steps = []
    for phase, offset in (("reduce-scatter", 0), ("all-gather", 1)):
        for s in range(n - 1):
            steps.append((phase, s + 1, [Transfer(r, (r + 1) % n, (r + offset - s) % n) for r in range(n)]))
    return steps


def simulate_ring(inputs) -> RingRun:
    """Run ring all-reduce on `inputs` (N ranks x length integers, length >= N) and keep every step.

    Each step's messages are all sent from the state before the step (the ranks send at the
    same time), then added (reduce-scatter) or copied (all-gather) at the receivers.
    """
    data = np.asarray(inputs)
    if data.ndim != 2 or data.shape[0] < 1:
        raise LabInputError(f"inputs must be a 2-D array, ranks x elements; got shape {data.shape}")
    if not np.issubdtype(data.dtype, np.integer):
        raise LabInputError(f"inputs must hold integers (so every sum is exact); got {data.dtype}")
    n, length = data.shape
    bounds = chunk_bounds(length, n)
    values = data.astype(np.int64).copy()
    contributors = np.zeros((n, n, n), dtype=bool)
    for r in range(n):
        contributors[r, :, r] = True
    steps = []
    for number, (phase, index, transfers) in enumerate(ring_schedule(n), start=1):
        before, before_from = values.copy(), contributors.copy()
        for t in transfers:
            start, stop = bounds[t.chunk]
            if phase == "reduce-scatter":
                values[t.dst, start:stop] += before[t.src, start:stop]
                contributors[t.dst, t.chunk] |= before_from[t.src, t.chunk]
            else:
                values[t.dst, start:stop] = before[t.src, start:stop]
                contributors[t.dst, t.chunk] = before_from[t.src, t.chunk]
        steps.append(RingStep(phase, index, number, tuple(transfers), values.copy(), contributors.copy()))
    return RingRun(data.astype(np.int64), tuple(steps), bounds)


def check_ring_run(run: RingRun) -> None:
    """Raise AssertionError unless every rank ends with the plain sum and holds every rank's input."""
    if not run.is_correct():
        raise AssertionError(f"the ring's result {run.result.tolist()} differs from the sum {run.expected.tolist()}")
    if run.steps and not run.steps[-1].contributors.all():
        raise AssertionError("some chunk misses a rank's contribution")


# --- 2. the bytes --------------------------------------------------------------------------------

def ring_bytes_per_rank(size_bytes, world_size):
    """Bytes each rank sends (and receives) in a ring all-reduce of `size_bytes`:

        2(N−1) steps x size/N bytes = 2(N−1)/N · size_bytes

    (N−1 chunks in reduce-scatter, N−1 in all-gather). It is nccl-tests' all_reduce bus factor
    times the size, which is why busbw = algbw · 2(N−1)/N is the rate each rank's link ran at.
    """

    check_range("size_bytes", size_bytes, low=0, unit="bytes")
    out = bus_factor("all_reduce", world_size) * np.asarray(size_bytes, dtype=float)
    return float(out) if np.ndim(out) == 0 else out


def bytes_table(world_sizes=(2, 3, 4, 8, 16), size_bytes: float = 1e6) -> pd.DataFrame:
    """Per N: steps, chunk size, bytes each rank sends counted from the simulation, and 2(N−1)/N·size.

    The count comes from `simulate_ring` on a buffer of N·k one-byte elements scaled to `size_bytes`.
    """
    rows = []
    for n in world_sizes:
        n = _whole("world_size", n, 2)
        run = simulate_ring(small_inputs(n))
        sent_share = float(run.elements_sent()[0]) / run.inputs.shape[1]
        rows.append({"N": n, "steps": len(run.steps), "chunk_bytes": size_bytes / n,
                     "sent_per_rank_bytes": sent_share * size_bytes,
                     "formula_2(N-1)/N_x_size": ring_bytes_per_rank(size_bytes, n),
                     "share_of_size": sent_share})
    return pd.DataFrame(rows)


# --- 3. ring against tree: steps, bytes, the alpha-beta model ------------------------------------

def btree_parents(world_size: int) -> list[int]:
    """Parent of each rank in NCCL's binary tree (-1 for the root, rank 0).

    Rank r > 0 with lowest set bit b has parent (r XOR b) | 2b, or r XOR b when that is not a
    rank (the rule of NCCL's ncclGetBtree). Odd ranks are the leaves; a rank has at most two
    children, and the tree is about log2 N levels deep.
    """
    n = _whole("world_size", world_size, 1)
    parents = [-1]
    for r in range(1, n):
        bit = r & -r
        up = (r ^ bit) | (bit << 1)
        parents.append(up if up < n else r ^ bit)
    return parents


def double_tree_parents(world_size: int) -> tuple[list[int], list[int]]:
    """NCCL's two complementary binary trees (ncclGetDtree): the first is `btree_parents`, the
    second the same tree with ranks mirrored, r -> N−1−r (N even), or shifted by one (N odd), so
    that the inner ranks of one tree (even) are leaves (odd) of the other."""
    n = _whole("world_size", world_size, 1)
    first = btree_parents(n)
    move = (lambda r: n - 1 - r) if n % 2 == 0 else (lambda r: (r + 1) % n)
    back = {move(r): r for r in range(n)}
    second = [-1 if first[back[r]] < 0 else move(first[back[r]]) for r in range(n)]
    return first, second


def _tree_sends(parents: list[int], payload: float) -> np.ndarray:
    """Bytes each rank sends in one reduce (up) + broadcast (down) of `payload` bytes on a tree."""
    sends = np.zeros(len(parents))
    for r, p in enumerate(parents):
        if p >= 0:
            sends[r] += payload  # up: its partial sum to its parent
            sends[p] += payload  # down: the parent sends the result to this child
    return sends


def bytes_sent_per_rank(algorithm: str, size_bytes: float, world_size: int) -> np.ndarray:
    """Bytes each rank sends in one all-reduce of `size_bytes` (one entry per rank).

    ring: 2(N−1)/N · size for every rank. tree (one plain binary tree, reduce up then broadcast
    down, the whole buffer on every edge): size up to the parent plus size down to each child,
    so inner ranks send up to 3·size. double_tree (NCCL's: half the buffer on each of two
    complementary trees): about 2·size for every rank, like the ring.
    """
    check_choice("algorithm", algorithm, ALGORITHMS)
    n = _whole("world_size", world_size, 1)
    check_range("size_bytes", size_bytes, low=0, unit="bytes")
    if algorithm == "ring":
        return np.full(n, ring_bytes_per_rank(size_bytes, n))
    if algorithm == "tree":
        return _tree_sends(btree_parents(n), float(size_bytes))
    first, second = double_tree_parents(n)
    return _tree_sends(first, size_bytes / 2) + _tree_sends(second, size_bytes / 2)


def steps_each_way(algorithm: str, world_size):
    """Point-to-point steps one after another, each way (reduce, then broadcast/gather):
    ring N−1, tree (plain or double) ceil(log2 N). Numpy-vectorised over N."""
    check_choice("algorithm", algorithm, ALGORITHMS)
    n = np.asarray(world_size, dtype=float)
    check_range("world_size", n, low=1)
    out = n - 1 if algorithm == "ring" else np.ceil(np.log2(n))
    return float(out) if np.ndim(out) == 0 else out


def allreduce_model_us(algorithm: str, size_bytes: float, world_size: int, alpha_step_us: float,
                       link_GBps: float) -> float:
    """The α–β time of one all-reduce, µs: 2 · steps_each_way · α_step + busiest rank's bytes / B.

    B is one link's rate in decimal GB/s (1e3 bytes per µs). The bandwidth term assumes the
    message is pipelined in small pieces, so the steps overlap and only the busiest rank's
    sending limits it. The latency part equals labutils.fit.latency_term_us for ring and tree.
    """
    n = _whole("world_size", world_size, 1)
    check_range("alpha_step_us", alpha_step_us, low=0, unit="us")
    check_range("link_GBps", link_GBps, low=0, low_open=True, unit="GB/s")
    if n == 1:
        return 0.0
    latency = 2 * steps_each_way(algorithm, n) * alpha_step_us
    return float(latency + bytes_sent_per_rank(algorithm, size_bytes, n).max() / (link_GBps * 1e3))


def ring_vs_tree_table(world_sizes=(2, 4, 8, 16, 32, 64, 128), size_bytes: float = 1e6,
                       alpha_step_us: float = 5.0, link_GBps: float = 22.0) -> pd.DataFrame:
    """Per N: steps each way, latency terms (µs), busiest rank's bytes / size, and model time (µs)
    for ring, plain tree and double tree."""

    rows = []
    for n in world_sizes:
        n = _whole("world_size", n, 1)
        row = {"N": n, "ring steps each way": steps_each_way("ring", n),
               "tree steps each way": steps_each_way("tree", n),
               "ring latency_us": latency_term_us(n, alpha_step_us, "ring"),
               "tree latency_us": latency_term_us(n, alpha_step_us, "tree")}
        for algo in ALGORITHMS:
            row[f"{algo} sent/size"] = float(bytes_sent_per_rank(algo, size_bytes, n).max()) / size_bytes
        for algo in ALGORITHMS:
            row[f"{algo} time_us"] = allreduce_model_us(algo, size_bytes, n, alpha_step_us, link_GBps)
        rows.append(row)
    return pd.DataFrame(rows)


# --- drawing -------------------------------------------------------------------------------------

def draw_ring_step(ax, run: RingRun, number: int) -> None:
    """Draw the buffers after step `number` (0: the inputs) on `ax`.

    One row of boxes per rank, one box per chunk with its numbers; a chunk that holds the full
    sum is green, one holding some ranks' inputs is shaded by how many; the chunks just received
    are outlined in red and every message of the step is an arrow from the sender's chunk down to
    its right neighbour's (the last rank's message wraps round to rank 0, drawn at the edges).
    """
    from matplotlib.patches import Rectangle

    n = run.world_size
    step = run.steps[number - 1] if number > 0 else None
    values = step.values if step else run.inputs
    holders = step.contributors if step else np.eye(n, dtype=bool)[:, None, :].repeat(n, axis=1)
    received = {(t.dst, t.chunk) for t in step.transfers} if step else set()
    row_gap, height = 1.0, 0.55  # rank r's boxes span y = -r*row_gap +- height/2
    longest = max(len(" ".join(map(str, _chunk(values[r], run.bounds, c).tolist())))
                  for r in range(n) for c in range(n))
    fontsize = max(5.0, min(10.0, 44.0 / max(4, longest)))
    arrow = {"arrowstyle": "-|>", "color": PALETTE[3], "lw": 1.4, "mutation_scale": 9}
    for r in range(n):
        y = -r * row_gap
        ax.text(-0.15, y, f"rank {r}", ha="right", va="center", fontsize=8, color="0.25")
        for c in range(n):
            share = holders[r, c].sum() / n
            colour = PALETTE[2] if holders[r, c].all() else (0.92 - 0.5 * share, 0.95 - 0.35 * share, 1.0)
            edge, lw = (PALETTE[3], 2.6) if (r, c) in received else ("0.35", 0.8)
            ax.add_patch(Rectangle((c + 0.04, y - height / 2), 0.92, height, facecolor=colour, edgecolor=edge,
                                   lw=lw, zorder=2))
            text = " ".join(map(str, _chunk(values[r], run.bounds, c).tolist()))
            ax.text(c + 0.5, y, text, ha="center", va="center", fontsize=fontsize, zorder=3,
                    color="white" if holders[r, c].all() else "black")
    top, bottom = height / 2, -(n - 1) * row_gap - height / 2
    for t in (step.transfers if step else ()):
        x = t.chunk + 0.5
        if t.dst == t.src + 1:
            ax.annotate("", xy=(x, -t.dst * row_gap + height / 2), xytext=(x, -t.src * row_gap - height / 2),
                        arrowprops=arrow, zorder=4)
        else:  # the ring closes: the last rank sends to rank 0
            ax.annotate("", xy=(x, bottom - 0.32), xytext=(x, bottom), arrowprops=arrow, zorder=4)
            ax.text(x, bottom - 0.36, f"to rank {t.dst}", ha="center", va="top", fontsize=7, color=PALETTE[3])
            ax.annotate("", xy=(x, top), xytext=(x, top + 0.32), arrowprops=arrow, zorder=4)
            ax.text(x, top + 0.36, f"from rank {t.src}", ha="center", va="bottom", fontsize=7, color=PALETTE[3])
    for c in range(n):
        ax.text(c + 0.5, bottom - 0.85, f"chunk {c}", ha="center", va="center", fontsize=7, color="0.4")
    ax.set_xlim(-1.1, n + 0.05)
    ax.set_ylim(bottom - 1.0, top + 0.75)
    ax.axis("off")
    if step is None:
        ax.set_title("the inputs", fontsize=10)
    else:
        verb = "adds it" if step.phase == "reduce-scatter" else "keeps it"
        ax.set_title(f"step {step.number}: {step.phase} {step.index}/{n - 1}\n"
                     f"each rank sends one chunk on; the receiver {verb}", fontsize=9)


def draw_ring(run: RingRun, columns: int | None = None):
    """One panel per step of `run` (the inputs first), as one matplotlib figure; returns it."""

    panels = len(run.steps) + 1
    cols = columns or min(4, panels)
    rows = math.ceil(panels / cols)
    n = run.world_size
    fig, axes = new_figure(rows, cols, figsize=(cols * (1.0 + 0.75 * n), rows * (1.3 + 0.55 * n)), squeeze=False)
    for i, ax in enumerate(axes.ravel()):
        if i < panels:
            draw_ring_step(ax, run, i)
        else:
            ax.axis("off")
    fig.suptitle(f"Ring all-reduce on {n} ranks, chunk by chunk (green: the full sum; red outline: "
                 "just received)", fontsize=11)
    fig.tight_layout()
    return fig


# --- 4. the real thing ---------------------------------------------------------------------------

def hand_ring_all_reduce(t) -> None:
    """Sum `t` (a contiguous 1-D tensor) over all ranks, in place, as a ring of point-to-point messages.

    Reduce-scatter then all-gather, the schedule of `ring_schedule`: each step posts a
    non-blocking `isend` to the right neighbour and a blocking `recv` from the left one, so no
    rank waits for a send that nobody receives yet. Every rank must call it with a tensor of
    the same length (chunks are cut as torch.tensor_split cuts them; empty chunks are skipped
    on both sides alike).
    """
    import torch
    import torch.distributed as dist

    n, r = dist.get_world_size(), dist.get_rank()
    if n == 1:
        return
    chunks = list(torch.tensor_split(t, n))
    right, left = (r + 1) % n, (r - 1) % n
    scratch = torch.empty_like(chunks[0])
    for s in range(n - 1):  # reduce-scatter: receive into scratch, add
        send, recv = chunks[(r - s) % n], chunks[(r - s - 1) % n]
        if send.numel():
            request = dist.isend(send, right)
        if recv.numel():
            dist.recv(scratch[:recv.numel()], left)
            recv.add_(scratch[:recv.numel()])
        if send.numel():
            request.wait()
    for s in range(n - 1):  # all-gather: receive straight into place
        send, recv = chunks[(r + 1 - s) % n], chunks[(r - s) % n]
        if send.numel():
            request = dist.isend(send, right)
        if recv.numel():
            dist.recv(recv, left)
        if send.numel():
            request.wait()


def _compare_with_all_reduce(count: int, dtype: str, ctx) -> int:
    """Elements (summed over ranks) where the hand ring differs from dist.all_reduce on the same
    input, or from the exact expected sum."""
    import torch
    import torch.distributed as dist

    mine = fill(ctx.rank, count, dtype, ctx.device)
    theirs = mine.clone()
    hand_ring_all_reduce(mine)
    dist.all_reduce(theirs)
    exact = expected(layout("all_reduce", count * mine.element_size(), dtype, ctx.world_size), ctx.rank, ctx.device)
    wrong = torch.tensor([int(((mine != theirs) | (mine != exact)).sum().item())], dtype=torch.int64,
                         device=ctx.device)
    dist.all_reduce(wrong)
    return int(wrong.item())


def ring_worker(ctx, sizes, dtype: str = "float32", budget_ms: float = 40.0, warmup: int = 2,
                rounds: int = 3, time_it: bool = True) -> list[dict]:
    """Run in every rank: per size, check the hand ring against dist.all_reduce, then time both.

    Timing: warm-up calls, a probe from which rank 0 picks the iteration count (harness.
    agree_iters, broadcast), then `rounds` rounds alternating which of the two goes first, each a
    timed loop between synchronised clocks (timing.time_loop); each keeps its median round and
    the mean over ranks (timing.across_ranks). Returns the same rows on every rank.
    """
    import torch
    import torch.distributed as dist

    rows = []
    for size in sizes:
        count = max(ctx.world_size, int(size) // element_bytes(dtype))
        wrong = _compare_with_all_reduce(count, dtype, ctx)
        row = {"size_bytes": count * element_bytes(dtype), "count": count, "world_size": ctx.world_size,
               "backend": ctx.backend, "wrong": wrong}
        if time_it:
            buf = torch.zeros(count, dtype=getattr(torch, dtype), device=ctx.device)
            calls = {"hand_ring": lambda: hand_ring_all_reduce(buf), "all_reduce": lambda: dist.all_reduce(buf)}  # noqa: B023
            for call in calls.values():
                for _ in range(max(1, warmup_iters(row["size_bytes"], warmup))):
                    call()
            probe = max(time_loop(call, 1, ctx.device) for call in calls.values())
            iters = agree_iters(probe, budget_ms / (2 * rounds), 1, 500, ctx.device)
            times = {name: [] for name in calls}
            for k in range(rounds):
                order = list(calls) if k % 2 == 0 else list(calls)[::-1]
                for name in order:
                    times[name].append(time_loop(calls[name], iters, ctx.device))
            for name, samples in times.items():
                row[f"{name}_us"] = across_ranks(statistics.median(samples), ctx.device).mean * 1e3
            row["iters"] = iters
        rows.append(row)
        if ctx.rank == 0:
            ctx.report({"done": len(rows), "of": len(sizes)})
    return rows


def run_hand_ring(sizes=(4096, 262144, 4 << 20), nproc: int = 4, dtype: str = "float32", budget_ms: float = 40.0,
                  time_it: bool = True, backend: str = "gloo", device: str = "cpu",
                  timeout_s: float | None = None) -> pd.DataFrame:
    """Launch `ring_worker` on `nproc` local ranks; one row per size with the check and both times.

    Columns: size_bytes, count, world_size, backend, wrong (must be 0), and when timed
    hand_ring_us, all_reduce_us, iters, ratio (hand / library), and each one's busbw in GB/s.
    """

    nproc = check_int("nproc", nproc, low=2)
    dtype = canonical_dtype(dtype)
    sizes = [check_int("size_bytes", int(s), low=1) for s in sizes]
    check_range("budget_ms", budget_ms, low=0, low_open=True, unit="ms")
    timeout_s = timeout_s or 60.0 + len(sizes) * (4 * budget_ms / 1e3 + 5.0)
    rows = launch(ring_worker, nproc, kwargs={"sizes": sizes, "dtype": dtype, "budget_ms": budget_ms,
                                              "time_it": time_it},
                  backend=backend, device=device, timeout_s=timeout_s, threads_per_rank=default_threads(nproc))[0]
    frame = pd.DataFrame(rows)
    if time_it and len(frame):
        frame["ratio"] = frame["hand_ring_us"] / frame["all_reduce_us"]
        for name in ("hand_ring", "all_reduce"):
            frame[f"{name}_busbw_GBps"] = [bandwidths_GBps("all_reduce", s, t, nproc)[1]
                                           for s, t in zip(frame["size_bytes"], frame[f"{name}_us"])]
    return frame
