"""Workers that only tests spawn. Spawned ranks import them as `rank_workers` (pytest puts tests/
on sys.path, and the spawn start method hands sys.path to the children)."""

import contextlib

import torch

from labutils.experiments.ddp_step import RankStep, StepConfig


def gradient_worker(ctx, width: int, depth: int, batch_per_rank: int,
                    runs=(("ddp", 0), ("no_overlap", 0)), seed: int = 0) -> dict:
    """This rank's flat gradient after one synchronised backward on its slice of the global batch.

    `runs` lists (mode, train_steps): a fresh model per run, `train_steps` full training steps
    first (replicas that drifted apart would show in the gradient). Returns {(mode, steps): array}.
    """
    out = {}
    for mode, train_steps in runs:
        step = RankStep(StepConfig(width, depth, batch_per_rank, mode, seed=seed, lr=0.1), ctx)
        for _ in range(train_steps):
            step.run(None)
        step.gradients(lambda name: contextlib.nullcontext())
        out[(mode, train_steps)] = torch.cat([p.grad.flatten() for p in step.params]).double().cpu().numpy()
    return out
