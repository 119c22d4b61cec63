"""Backward communication in tensor parallelism: Megatron-LM's f and g operators.

Reading order:
1. the two operators, as torch.autograd.Function classes (Shoeybi et al., "Megatron-LM", 2019,
   section 3, figure 3):
   - f = `CopyToRanks`:   forward identity,   backward all-reduce (sum) of the gradient;
   - g = `ReduceFromRanks`: forward all-reduce (sum), backward identity;
   every call appends what it communicated to a `log` list, so a step's all-reduces can be counted;
2. the split MLP block of labutils.experiments.tensor_parallel written with them:
   out = LayerNorm(x + g(act(f(x) W1_r + b1_r) W2_r) + b2).
   The forward needs g (sum the partial outputs); the backward needs f: each rank's gradient of
   x through its own columns of W1 is a partial sum, and only their sum is dL/dx;
3. the same for an attention block split by heads (Q, K, V by columns, the output projection by
   rows), and a transformer layer = attention block + MLP block;
4. the count: per block one g in the forward and one f in the backward, 2 all-reduces of
   tokens x hidden elements per block and training step (the rows of x are tokens: batch x
   sequence length in a transformer); a layer of attention + MLP makes 4 in training and 2 in
   inference, which runs forward only (the paper's count: two in the forward pass and two in the
   backward, its figure 4); `tp_allreduce_bytes` multiplies them out for a model of L layers;
5. workers that run forward AND backward on ranks and compare the input gradient and every
   weight gradient with the whole (unsplit) block, within labutils.experiments.tensor_parallel.tolerance.

Workers (functions a spawned rank runs) live here and are run by the kernel's rank pool
(`labutils.measure.pool.shared_pool`);
every rank makes the same collective calls in the same order.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
from dataclasses import astuple, dataclass

import pandas as pd
import torch
import torch.distributed as dist

from labutils.core.busbw import element_bytes
from labutils.core.inputs import LabInputError, check_choice, check_int, check_range
from labutils.experiments.tensor_parallel import (
    LAYER_DTYPES,
    MLPWeights,
    as_size,
    compare,
    dist_world_size,
    mlp_block,
    mlp_input,
    mlp_partial,
    mlp_weights,
    run_tp_check,
    serial_tail,
    shard,
    split_columns,
    tolerance,
)
from labutils.measure.buffers import torch_dtype
from labutils.measure.launch import MAX_TIMEOUT_S, RankError, free_memory_bytes, resolve_backend
from labutils.measure.placement import check_local_ranks
from labutils.measure.pool import shared_pool

# --- 1. f and g -------------------------------------------------------------------------------------


def _all_reduce_copy(t):
    """A new tensor holding the sum of `t` over all ranks (`t` itself is left alone)."""
    out = t.contiguous().clone()
    if dist_world_size() > 1:
        dist.all_reduce(out)
    return out


def _note(log, op: str, direction: str, t) -> None:
    if log is not None:
        log.append({"op": op, "pass": direction, "elements": int(t.numel()),
                    "bytes": int(t.numel() * t.element_size()), "world_size": dist_world_size()})


class CopyToRanks(torch.autograd.Function):
    """f: identity in the forward pass; all-reduce (sum) of the incoming gradient in the backward."""

    @staticmethod
    def forward(ctx, x, log):
        ctx.log = log
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        _note(ctx.log, "f", "backward", grad)
        return _all_reduce_copy(grad), None


class ReduceFromRanks(torch.autograd.Function):
    """g: all-reduce (sum) of the partial outputs in the forward pass; identity in the backward."""

    @staticmethod
    def forward(ctx, y, log):
        _note(log, "g", "forward", y)
        return _all_reduce_copy(y)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def f(x, log: list | None = None):
    """Megatron's f: returns x unchanged; in the backward pass the gradient is all-reduced."""
    return CopyToRanks.apply(x, log)


def g(y, log: list | None = None):
    """Megatron's g: returns the sum of y over all ranks; in the backward pass the gradient passes unchanged."""
    return ReduceFromRanks.apply(y, log)


# --- 2. the split MLP block ---------------------------------------------------------------------------


def split_mlp_block(x, w: MLPWeights, activation: str = "relu", log: list | None = None, use_f: bool = True):
    """This rank's MLP block with f and g: LayerNorm(x + g(act(f(x) W1_r + b1_r) W2_r) + b2).

    `w` holds this rank's shard (labutils.experiments.tensor_parallel.shard); b2 is whole and added once,
    after g. The residual x bypasses f: its gradient is the same on every rank already.
    `use_f=False` leaves f out (the mistake to see): the forward pass and the weights' gradients
    are unchanged, but dL/dx is then only this rank's partial sum.
    """
    return serial_tail(x, g(mlp_partial(f(x, log) if use_f else x, w, activation), log), w.b2)


# --- 3. the split attention block and a layer ---------------------------------------------------------


@dataclass(frozen=True)
class AttentionWeights:
    """Wq, Wk, Wv (hidden x hidden, heads side by side in the columns), Wo (hidden x hidden), bo (hidden)."""

    Wq: object
    Wk: object
    Wv: object
    Wo: object
    bo: object


def attention_weights(hidden: int, seed: int = 0, dtype: str = "float32", device: str = "cpu") -> AttentionWeights:
    """Deterministic attention weights from `seed`, scaled 1/sqrt(hidden); drawn in float64, then cast."""
    gen = torch.Generator().manual_seed(seed + 2_000_003)
    mats = [torch.randn(hidden, hidden, generator=gen, dtype=torch.float64) / math.sqrt(hidden) for _ in range(4)]
    bo = torch.randn(hidden, generator=gen, dtype=torch.float64) * 0.1
    return AttentionWeights(*(t.to(device=device, dtype=torch_dtype(dtype)) for t in (*mats, bo)))


def shard_attention(w: AttentionWeights, heads: int, rank: int, world_size: int) -> AttentionWeights:
    """Rank `rank`'s heads: their columns of Wq, Wk, Wv (column-parallel) and rows of Wo (row-parallel)."""
    hidden = w.Wq.shape[0]
    heads = check_int("heads", heads, low=1, high=hidden)
    if hidden % heads:
        raise LabInputError(f"heads={heads} must divide hidden={hidden}")
    head_groups = split_columns(heads, world_size, "world_size")
    width = hidden // heads
    group = head_groups[rank]
    cols = slice(group.start * width, group.stop * width)
    return AttentionWeights(w.Wq[:, cols].contiguous(), w.Wk[:, cols].contiguous(), w.Wv[:, cols].contiguous(),
                            w.Wo[cols, :].contiguous(), w.bo)


def attention_partial(x, w: AttentionWeights, head_dim: int):
    """Self-attention over the rows of x (tokens) with the heads in `w`, before the sum over ranks:
    concat_h softmax(q_h k_h^T / sqrt(d)) v_h, times this rank's rows of Wo (no bo)."""
    tokens = x.shape[0]
    q, k, v = ((x @ m).view(tokens, -1, head_dim).transpose(0, 1) for m in (w.Wq, w.Wk, w.Wv))
    scores = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(head_dim), dim=-1)
    return (scores @ v).transpose(0, 1).reshape(tokens, -1) @ w.Wo


def layer(x, attn: AttentionWeights, mlp: MLPWeights, heads: int, activation: str = "relu", log: list | None = None):
    """A transformer layer (post-LayerNorm): h = LN(x + g(attn(f(x))) + bo); out = LN(h + g(mlp(f(h))) + b2).

    With whole weights on one rank, f and g do nothing but log: the layer is the reference.
    """
    head_dim = x.shape[1] // heads
    h = serial_tail(x, g(attention_partial(f(x, log), attn, head_dim), log), attn.bo)
    return serial_tail(h, g(mlp_partial(f(h, log), mlp, activation), log), mlp.b2)


# --- 4. the count --------------------------------------------------------------------------------------

BLOCKS = ("attention", "mlp")


def allreduces_per_step(blocks=BLOCKS) -> int:
    """All-reduces per layer per training step: each split block has one g (forward) and one f (backward).

    2 * len(blocks): 2 for an MLP block alone, 4 for attention + MLP (the budget's Q per layer).
    Each moves tokens x hidden elements (the layer's rows; batch x sequence in a transformer).
    """
    blocks = tuple(blocks)
    for b in blocks:
        check_choice("blocks", b, BLOCKS)
    return 2 * len(blocks)


def allreduces_per_forward(blocks=BLOCKS) -> int:
    """All-reduces per layer in a forward pass alone (inference): one g per split block, the f's
    all-reduce only in the backward. 2 for attention + MLP."""
    return allreduces_per_step(blocks) // 2


def tp_allreduce_bytes(layers: int, tokens: int, hidden: int, dtype: str = "bfloat16", training: bool = True,
                       blocks=BLOCKS) -> int:
    """Bytes tensor parallelism all-reduces in one step of `layers` split transformer layers:
    count x layers x V, V = tokens x hidden x bytes per element (the buffer handed to all_reduce,
    not what a ring sends: that is 2(N-1)/N of it per rank). count = 4 per layer in a training
    step (forward and backward), 2 in inference (forward only)."""
    layers = check_int("layers", layers, low=1)
    tokens = check_int("tokens", tokens, low=1)
    hidden = check_int("hidden", hidden, low=1)
    count = allreduces_per_step(blocks) if training else allreduces_per_forward(blocks)
    return count * layers * tokens * hidden * element_bytes(dtype)


def count_table(log: list[dict]) -> pd.DataFrame:
    """The log of f and g calls as a table, one row per all-reduce, in the order they happened."""
    frame = pd.DataFrame(log, columns=["op", "pass", "elements", "bytes", "world_size"])
    frame.insert(0, "n", range(1, len(frame) + 1))
    return frame


# --- 5. forward and backward on ranks, against the whole -----------------------------------------------

MLP_TENSORS = ("x", "W1", "b1", "W2", "b2")


def _leaves(tensors):
    return [t.detach().clone().requires_grad_(True) for t in tensors]


def upstream_gradient(batch: int, hidden: int, seed: int = 0, dtype: str = "float32", device: str = "cpu"):
    """The fixed dL/d(out) of the checks: loss = sum(out * G), G standard normal from `seed`."""
    return mlp_input(batch, hidden, seed + 17, dtype, device)


def _mlp_gradients(x, weights: MLPWeights, G, activation: str, split: bool, log: list | None, use_f: bool = True):
    leaves = _leaves([x, weights.W1, weights.b1, weights.W2, weights.b2])
    w = MLPWeights(*leaves[1:])
    out = split_mlp_block(leaves[0], w, activation, log, use_f) if split else mlp_block(leaves[0], w, activation)
    (out * G).sum().backward()
    return out.detach(), {name: t.grad for name, t in zip(MLP_TENSORS, leaves)}


def _slice_like(name: str, grad, rank: int, world_size: int):
    """The whole block's gradient of `name` cut as rank `rank`'s shard is cut (x and b2 are whole)."""
    if name in ("x", "b2"):
        return grad
    cols = split_columns(grad.shape[0] if name == "W2" else grad.shape[-1], world_size, "world_size")[rank]
    return grad[cols, :] if name == "W2" else grad[..., cols]


def backward_check_worker(ctx, size=(8, 64), seed: int = 0, dtypes=("float32",), activation: str = "relu",
                          use_f: bool = True) -> list[dict]:
    """Forward and backward of the split MLP block on this rank (with f and g) against the whole block.

    Every rank draws the same full weights and input from `seed`, keeps its shard, runs
    loss = sum(out * G) forward and backward, and compares dL/dx and the gradient of each of its
    weight shards with the same slice of the whole block's gradients, computed locally.
    `ok` = max_rel <= tolerance(dtype, max(hidden, ffn), N), as in the forward check.
    One row per (dtype, tensor); `allreduces` is how many f/g all-reduces the step made.
    `use_f=False` runs the block without f (see `split_mlp_block`): dx then fails the check.
    """
    size = as_size(size)
    rows = []
    for dtype in dtypes:
        full = mlp_weights(size.hidden, size.ffn, seed, dtype, ctx.device)
        x = mlp_input(size.batch, size.hidden, seed, dtype, ctx.device)
        G = upstream_gradient(size.batch, size.hidden, seed, dtype, ctx.device)
        log: list[dict] = []
        out, split_grads = _mlp_gradients(x, shard(full, ctx.rank, ctx.world_size), G, activation, True, log,
                                            use_f)
        ref_out, whole_grads = _mlp_gradients(x, full, G, activation, False, None)
        tol = tolerance(dtype, max(size.hidden, size.ffn), ctx.world_size)
        for name in ("out", *MLP_TENSORS):
            got = out if name == "out" else split_grads[name]
            ref = ref_out if name == "out" else _slice_like(name, whole_grads[name], ctx.rank, ctx.world_size)
            diff = compare(got, ref)
            rows.append({"rank": ctx.rank, "world_size": ctx.world_size, "dtype": dtype,
                         "tensor": name if name == "out" else f"d{name}", "shape": tuple(got.shape), **diff,
                         "tolerance": tol, "ok": diff["max_rel"] <= tol, "allreduces": len(log),
                         "device": ctx.device, "backend": ctx.backend})
    return rows


def run_backward_check(nproc: int = 2, size=(8, 64), dtypes=("float32",), seed: int = 0, backend: str = "gloo",
                       device: str = "cpu", activation: str = "relu", timeout_s: float = 120.0,
                       use_f: bool = True) -> pd.DataFrame:
    """Launch `backward_check_worker` on `nproc` ranks; one row per (dtype, tensor, rank)."""
    dtypes = (dtypes,) if isinstance(dtypes, str) else tuple(dtypes)
    for d in dtypes:
        check_choice("dtypes", d, LAYER_DTYPES)
    split_columns(as_size(size).ffn, nproc, "nproc")  # refuse here, not in every rank
    per_rank = shared_pool(nproc, backend, device).run(
        backward_check_worker, kwargs={"size": astuple(as_size(size)), "seed": seed, "dtypes": dtypes,
                                       "activation": activation, "use_f": bool(use_f)}, timeout_s=timeout_s)
    frame = pd.DataFrame([row for rows in per_rank for row in rows])
    order = {name: i for i, name in enumerate(("out", *(f"d{t}" for t in MLP_TENSORS)))}
    return frame.sort_values(["dtype", "tensor", "rank"], key=lambda s: s.map(order) if s.name == "tensor" else s,
                             ignore_index=True)


def layer_step_worker(ctx, size=(8, 64), heads: int = 4, seed: int = 0, activation: str = "relu") -> dict:
    """One training step (forward + backward) of a split transformer layer (attention + MLP) in float32.

    Returns this rank's log of all-reduces, in order, and how far its dL/dx and output are from
    the whole layer's (relative to their largest value), with the float32 tolerance.
    """
    size = as_size(size)
    full_mlp = mlp_weights(size.hidden, size.ffn, seed, "float32", ctx.device)
    full_attn = attention_weights(size.hidden, seed, "float32", ctx.device)
    x = mlp_input(size.batch, size.hidden, seed, "float32", ctx.device)
    G = upstream_gradient(size.batch, size.hidden, seed, "float32", ctx.device)
    log: list[dict] = []
    x_split, x_whole = _leaves([x, x])
    out_split = layer(x_split, shard_attention(full_attn, heads, ctx.rank, ctx.world_size),
                      shard(full_mlp, ctx.rank, ctx.world_size), heads, activation, log)
    (out_split * G).sum().backward()
    out_whole = _local_layer(x_whole, full_attn, full_mlp, heads, activation)  # this rank alone, no f or g
    (out_whole * G).sum().backward()
    tol = tolerance("float32", max(size.hidden, size.ffn), ctx.world_size)
    return {"rank": ctx.rank, "world_size": ctx.world_size, "log": log,
            "out_max_rel": compare(out_split.detach(), out_whole.detach())["max_rel"],
            "dx_max_rel": compare(x_split.grad, x_whole.grad)["max_rel"], "tolerance": tol}


def _local_layer(x, attn: AttentionWeights, mlp: MLPWeights, heads: int, activation: str):
    """The whole layer without f and g (nothing to sum): the reference on one rank."""
    h = serial_tail(x, attention_partial(x, attn, x.shape[1] // heads), attn.bo)
    return serial_tail(h, mlp_partial(h, mlp, activation), mlp.b2)


def run_layer_step(nproc: int = 2, size=(8, 64), heads: int = 4, seed: int = 0, backend: str = "gloo",
                   device: str = "cpu", timeout_s: float = 120.0) -> list[dict]:
    """Launch `layer_step_worker` on `nproc` ranks; one dict per rank (see the worker)."""
    size = as_size(size)
    heads = check_int("heads", heads, low=1, high=size.hidden)
    if size.hidden % heads:
        raise LabInputError(f"heads={heads} must divide hidden={size.hidden}")
    split_columns(heads, nproc, "nproc")
    split_columns(size.ffn, nproc, "nproc")
    return shared_pool(nproc, backend, device).run(
        layer_step_worker, kwargs={"size": astuple(size), "heads": heads, "seed": seed}, timeout_s=timeout_s)


def backward_report(frame: pd.DataFrame) -> str:
    """The backward check as `tp-check` prints it: one line per (dtype, tensor, rank), then the verdict."""
    cols = ["dtype", "tensor", "rank", "max_abs", "max_rel", "tolerance", "ok"]
    per_step = int(frame["allreduces"].iloc[0]) if len(frame) else 0
    lines = [frame[cols].to_string(index=False),
             f"all-reduces per training step of the block, counted: {per_step} (g forward + f backward; "
             f"a layer of attention + MLP makes {allreduces_per_step()})"]
    return "\n".join(lines)


# --- the command line: tp-check runs the forward check (tensor_parallel) and the backward one (here) ------

MAX_SEED = 2**63 - 1
# A rank is a new Python process that imports torch before it can answer: about 2 s on the 2-core
# test machine, never under a second anywhere. A shorter timeout can only end in a hung-rank error.
MIN_TIMEOUT_S = 1.0


def tp_check_bytes(nproc: int, batch: int, hidden: int) -> tuple[int, int]:
    """(bytes the weights need, bytes the activations need) across `nproc` local ranks of
    tp-check, in fp32: each rank builds the whole block to compare with (W1 and W2, 4·h² values
    each, and their gradients: 16·h²) and about 8 activations of batch x 4h (32·batch·h)."""
    return 4 * nproc * 16 * hidden * hidden, 4 * nproc * 32 * batch * hidden


def _tp_inputs(args):
    """Every tp-check input checked before a rank starts (one LabInputError naming the value)."""
    dtypes = tuple(d.strip() for d in args.dtypes.split(",") if d.strip())
    if not dtypes:
        raise LabInputError(f"dtypes={args.dtypes!r} names no dtype; give one or more of: {', '.join(LAYER_DTYPES)}")
    for d in dtypes:
        check_choice("dtypes", d, LAYER_DTYPES)
    nproc = check_local_ranks(args.nproc, oversubscribe=args.oversubscribe or None)
    batch = check_int("batch", args.batch, low=1)
    hidden = check_int("hidden", args.hidden, low=1)
    check_int("seed", args.seed, low=0, high=MAX_SEED)
    check_range("timeout_s", args.timeout_s, low=MIN_TIMEOUT_S, high=MAX_TIMEOUT_S, high_open=True,
                unit="s (a rank needs about a second to start)")
    choice = resolve_backend(args.backend, args.device, nproc)
    weights, activations = tp_check_bytes(nproc, batch, hidden)
    free = free_memory_bytes(choice.device, nproc)
    if weights + activations > free:
        name, value = ("hidden", hidden) if weights >= activations else ("batch", batch)
        raise LabInputError(f"{name}={value} is too large: {nproc} rank(s) x the whole block need about "
                            f"{(weights + activations) / 1e9:.3g} GB of {choice.device} memory, "
                            f"{free / 1e9:.3g} GB is free; lower --{name}")
    return dtypes, choice


def _cli(args) -> int:
    dtypes, choice = _tp_inputs(args)
    with contextlib.ExitStack() as stack:
        if args.oversubscribe:  # the launcher reads it: tp-check's ranks were checked above
            before = os.environ.get("LAB_OVERSUBSCRIBE")
            os.environ["LAB_OVERSUBSCRIBE"] = "1"
            stack.callback(lambda: os.environ.pop("LAB_OVERSUBSCRIBE") if before is None
                           else os.environ.__setitem__("LAB_OVERSUBSCRIBE", before))
        try:
            return _run_cli(args, dtypes, choice)
        except RankError as exc:  # the ranks were stopped; say so in one line, not a traceback
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            slow = " within " in first
            hint = f" (--timeout-s {args.timeout_s:g}: a longer one gives slow ranks time)" if slow else ""
            print(f"error: {first}{hint}", file=sys.stderr)
            return 1


def _run_cli(args, dtypes, choice) -> int:
    frame = run_tp_check(args.nproc, (args.batch, args.hidden), dtypes, args.seed, choice.backend, choice.device,
                         timeout_s=args.timeout_s)
    print(f"{args.nproc} ranks, {choice.backend} on {choice.device}: split MLP block {args.batch}x{args.hidden} "
          "against the whole block")
    print("forward: the output")
    print(frame[["dtype", "rank", "max_abs", "max_rel", "tolerance", "ok"]].to_string(index=False))
    grads = run_backward_check(args.nproc, (args.batch, args.hidden), dtypes, args.seed, choice.backend,
                               choice.device, timeout_s=args.timeout_s)
    print("backward (f and g): dL/dx and every weight's gradient, this rank's shard against the whole block's")
    print(backward_report(grads))
    ok = bool(frame["ok"].all() and grads["ok"].all())
    print("PASS" if ok else "FAIL: a split differs from the whole by more than its tolerance")
    return 0 if ok else 1


def add_cli(sub) -> None:
    """`python -m labutils tp-check [--nproc 2] [--dtypes float32,bfloat16] ...`"""
    parser = sub.add_parser("tp-check", help="run the column/row-parallel MLP block on N ranks and check it",
                            description="Run the Megatron-style MLP block split over N local ranks (one "
                                        "all-reduce) and compare every rank's output with the whole block "
                                        "within the dtype's tolerance; then forward and backward with "
                                        "Megatron's f and g, comparing the input's and every weight's "
                                        "gradient. Exit status 1 when one differs.")
    parser.add_argument("--nproc", type=int, default=2,
                        help="ranks (must divide 4 * hidden; at most 2 per core, 8 on any machine) [2]")
    parser.add_argument("--oversubscribe", action="store_true", help="allow up to 16 ranks per core")
    parser.add_argument("--batch", type=int, default=8, help="rows of the input [8]")
    parser.add_argument("--hidden", type=int, default=64, help="hidden width; the MLP is 4x wider [64]")
    parser.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated dtypes [float32,bfloat16]")
    parser.add_argument("--backend", default="auto", choices=("auto", "gloo", "nccl"))
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout-s", type=float, default=120.0,
                        help=f"seconds before stuck ranks are stopped, at least {MIN_TIMEOUT_S:g} [120]")
    parser.set_defaults(func=_cli)
