"""Ring all-reduce by hand: the algorithm chunk by chunk, the bytes it sends, and a real one.

Reading order:
1. the simulation (`simulate_ring`): N ranks, each holding a buffer cut into N chunks. A
   reduce-scatter of N−1 steps, then an all-gather of N−1 steps. In reduce-scatter step s
   (s = 0 .. N−2) rank r sends chunk (r − s) mod N to its right neighbour r + 1, which adds it
   to its own copy; afterwards rank r holds the full sum of chunk (r + 1) mod N. In all-gather
   step s rank r sends chunk (r + 1 − s) mod N to r + 1, which overwrites its copy. Every
   intermediate state is kept as small integer arrays, with which ranks' inputs each chunk
   already holds, so a reader can follow every number; `ring_draw.draw_ring` draws one panel per step.
2. the bytes: every step each rank sends one chunk, size/N bytes, so over 2(N−1) steps a rank
   sends 2(N−1)/N · size bytes (and receives as many): nccl-tests' bus factor. Dividing the bytes
   each rank moves by the time gives busbw, a per-link rate comparable across N.
3. ring against tree: the α–β model. A ring is 2(N−1) steps in a row (N−1 each way), a binary
   tree about 2·log2 N (up, then down). The bandwidth term counts the bytes the busiest rank
   sends, from explicitly built trees: NCCL's *double* binary tree moves 2·size per rank (each
   rank is inner in one tree, 3 · size/2, and a leaf in the other, size/2), against the ring's
   2(N−1)/N · size: 1.33x the ring's bytes at N = 4, the two meeting only as N grows (NCCL's
   tuning model, src/graph/tuning.cc, likewise converts a tree's bus bandwidth to algorithm
   bandwidth with a factor 1/2, the ring's with N / 2(N−1)). A plain binary tree's inner ranks
   send 3·size (one copy up, two down). NCCL builds its trees across nodes; inside a node its
   ranks form a chain. `bytes_sentence` and `fastest_sentence` say what a table shows, from its
   numbers.
4. the real thing (`labutils.experiments.hand_ring`: `hand_ring_all_reduce`, `run_hand_ring`): the same algorithm
   with torch.distributed point-to-point `isend`/`recv` on N ranks (gloo on the CPU), checked
   element by element against `dist.all_reduce` on the same data and timed against it.

Everything in 1–3, this module, is arithmetic on numbers; 4 is a measurement.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from labutils.core.busbw import bus_factor
from labutils.core.inputs import LabInputError, check_choice, check_int, check_number, check_range, check_whole
from labutils.model.fit import latency_term_us


def _whole(name: str, value, low: int = 1, high: int | None = None) -> int:
    """check_int that also takes numpy integers (an N taken from an array)."""
    return check_int(name, value.item() if isinstance(value, np.generic) else value, low=low, high=high)


def _world_sizes(world_sizes, low: int, high: int) -> list[int]:
    """A table's world sizes: a non-empty list of whole numbers in [low, high], else LabInputError."""
    check_whole("world_sizes", world_sizes, low=low, high=high, unit="ranks")
    sizes = [int(n) for n in np.atleast_1d(world_sizes)]
    if not sizes:
        raise LabInputError("world_sizes=[] is empty: give the world sizes of the table, such as (2, 4, 8)")
    return sizes


ALGORITHMS = ("ring", "tree", "double_tree")
MAX_SIMULATED = 128  # bytes_table simulates every N: N x N elements over 2(N - 1) steps (128: half a second)
MAX_TABLE_RANKS = 2**16  # ring_vs_tree_table builds each rank's bytes: an array of N


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
                shown = (lambda values: " ".join(map(str, chunk_view(values, self.bounds, t.chunk).tolist())))  # noqa: B023 - called at once, in this iteration
                rows.append({"step": step.number, "phase": step.phase, "from rank": t.src, "to rank": t.dst,
                             "chunk": t.chunk, "sent": shown(before[t.src]),
                             "receiver's chunk after": shown(step.values[t.dst])})
            before = step.values
        return pd.DataFrame(rows)


def chunk_view(buffer: np.ndarray, bounds, c: int) -> np.ndarray:
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
    sizes = _world_sizes(world_sizes, 2, MAX_SIMULATED)
    size_bytes = check_number("size_bytes", size_bytes, low=0, high=1e18, unit="bytes")
    rows = []
    for n in sizes:
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
    complementary trees): 2·size for the busiest rank from N = 4 (size at N = 2, where it ties
    with the ring), more than the ring's 2(N−1)/N · size at every N > 2.
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
    sending limits it. The latency part equals labutils.model.fit.latency_term_us for ring and tree.
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
    sizes = _world_sizes(world_sizes, 1, MAX_TABLE_RANKS)
    size_bytes = check_number("size_bytes", size_bytes, low=0, low_open=True, high=1e18, unit="bytes")
    rows = []
    for n in sizes:
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


# --- 3b. what the table shows, said from its numbers ---------------------------------------------

NAMES = {"ring": "the ring", "tree": "the plain binary tree", "double_tree": "the double binary tree"}


def times_words(a: float, b: float, rel_tol: float = 0.005) -> str:
    """a against b in words: "the same as" within `rel_tol`, else "1.33x" (a / b, 2 decimals)."""
    return "the same as" if abs(a / b - 1) <= rel_tol else f"{a / b:.2f}x"


def _ranges(ns: list[int]) -> str:
    """[2, 4, 8, 16] -> "N = 2 to 16" (consecutive rows of the table), [4] -> "N = 4"."""
    return f"N = {ns[0]}" if len(ns) == 1 else f"N = {ns[0]} to {ns[-1]}"


def _groups(ns, keys) -> list[tuple[object, list[int]]]:
    """Consecutive rows with the same key: [(key, [N, ...]), ...]."""
    out = []
    for n, key in zip(ns, keys):
        if out and out[-1][0] == key:
            out[-1][1].append(int(n))
        else:
            out.append((key, [int(n)]))
    return out


def decimal_size(size_bytes: float) -> str:
    """64e6 -> "64 MB", 1e3 -> "1 kB", 512 -> "512 bytes" (decimal units, as nccl-tests' sizes)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if size_bytes >= scale:
            return f"{size_bytes / scale:.3g} {unit}"
    return f"{size_bytes:.3g} bytes"


def bytes_sentence(table: pd.DataFrame, algorithm: str = "double_tree", rel_tol: float = 0.005) -> str:
    """What the `sent/size` rows of `ring_vs_tree_table` show for `algorithm` against the ring, from
    the numbers: its busiest rank's bytes over the ring's at each N, then at which N it sends more,
    the same (within `rel_tol`) or less."""
    check_choice("algorithm", algorithm, ("tree", "double_tree"))
    ns, ring_share, other = table["N"].tolist(), table["ring sent/size"], table[f"{algorithm} sent/size"]
    listed = ", ".join(f"{o / r:.2f} at N = {n}" for o, r, n in zip(other, ring_share, ns))
    kinds = ["as much as" if times_words(o, r, rel_tol) == "the same as" else ("more than" if o > r else "less than")
             for o, r in zip(other, ring_share)]
    said = "; ".join(f"{kind} the ring at {_ranges(group)}" for kind, group in _groups(ns, kinds))
    return (f"Bytes the busiest rank sends, {NAMES[algorithm]} over the ring: {listed}. "
            f"{NAMES[algorithm].capitalize()} sends {said}.")


def fastest_sentence(table: pd.DataFrame, size_bytes: float, rel_tol: float = 0.005) -> str:
    """Which algorithm the α–β model of `ring_vs_tree_table` finds fastest at each N, from the
    `time_us` rows; algorithms within `rel_tol` of the fastest tie. Consecutive N with the same
    answer are joined ("N = 2 to 16")."""
    winners = []
    for _, row in table.iterrows():
        best = min(row[f"{a} time_us"] for a in ALGORITHMS)
        winners.append(tuple(a for a in ALGORITHMS if row[f"{a} time_us"] <= best * (1 + rel_tol)))
    parts = []
    for names, group in _groups(table["N"].tolist(), winners):
        who = [NAMES[a] for a in names]
        parts.append(f"at {_ranges(group)} {who[0]} is the fastest" if len(who) == 1 else
                     f"at {_ranges(group)} all three take the same time" if len(who) == len(ALGORITHMS) else
                     f"at {_ranges(group)} {' and '.join(who)} tie as the fastest")
    return f"In this model, a {decimal_size(size_bytes)} all-reduce: {'; '.join(parts)}."
