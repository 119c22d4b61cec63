"""Megatron's f and g: gradients of the split block on real ranks against the whole, and the count."""

import pytest
import torch

from labutils.core.inputs import LabInputError
from labutils.experiments import megatron as mg
from labutils.experiments import tensor_parallel as tp


def test_allreduces_per_step_is_two_per_block():
    assert mg.allreduces_per_step(("mlp",)) == 2
    assert mg.allreduces_per_step(("attention",)) == 2
    assert mg.allreduces_per_step() == 4
    with pytest.raises(LabInputError, match="blocks='conv'"):
        mg.allreduces_per_step(("conv",))


def test_allreduce_bytes_of_a_model_in_training_and_inference():
    """V = tokens x hidden x bytes, 4 per layer in a training step and 2 in inference."""
    assert mg.allreduces_per_forward() == 2 and mg.allreduces_per_forward(("mlp",)) == 1
    v = 4 * 2048 * 4096 * 2
    assert mg.tp_allreduce_bytes(32, 4 * 2048, 4096, "bfloat16") == 4 * 32 * v
    assert mg.tp_allreduce_bytes(32, 4 * 2048, 4096, "bfloat16", training=False) == 2 * 32 * v
    assert mg.tp_allreduce_bytes(1, 8, 64, "float32", blocks=("mlp",)) == 2 * 8 * 64 * 4
    with pytest.raises(LabInputError, match="layers=0"):
        mg.tp_allreduce_bytes(0, 8, 64)


def test_f_and_g_on_one_process_are_the_whole_block_and_log_their_passes():
    """Without a process group there is nothing to sum: f and g are identities, but they log."""
    w = tp.mlp_weights(16, 64, seed=2)
    x = tp.mlp_input(4, 16, seed=2).requires_grad_(True)
    log = []
    out = mg.split_mlp_block(x, w, "relu", log)
    assert torch.equal(out, tp.mlp_block(x, w))
    assert [(e["op"], e["pass"]) for e in log] == [("g", "forward")]
    out.sum().backward()
    assert [(e["op"], e["pass"]) for e in log] == [("g", "forward"), ("f", "backward")]
    assert all(e["bytes"] == 4 * 16 * 4 and e["world_size"] == 1 for e in log)
    table = mg.count_table(log)
    assert table["n"].tolist() == [1, 2] and table["op"].tolist() == ["g", "f"]


def test_attention_shards_are_head_slices():
    w = mg.attention_weights(32, seed=1)
    parts = [mg.shard_attention(w, 4, r, 2) for r in range(2)]
    assert torch.equal(torch.cat([p.Wq for p in parts], dim=1), w.Wq)
    assert torch.equal(torch.cat([p.Wo for p in parts], dim=0), w.Wo)
    x = tp.mlp_input(6, 32, seed=1)
    whole = mg.attention_partial(x, w, 8)
    summed = sum(mg.attention_partial(x, p, 8) for p in parts)
    assert tp.compare(summed, whole)["max_rel"] <= tp.tolerance("float32", 32, 2)
    with pytest.raises(LabInputError, match="heads=3"):
        mg.shard_attention(w, 3, 0, 2)


@pytest.mark.distributed
def test_split_gradients_match_the_whole_block_on_two_ranks():
    frame = mg.run_backward_check(2, size=(8, 64), dtypes=("float32",), timeout_s=60)
    assert set(frame["tensor"]) == {"out", "dx", "dW1", "db1", "dW2", "db2"}
    assert len(frame) == 12 and set(frame["rank"]) == {0, 1}
    assert frame["ok"].all()
    assert (frame["max_rel"] <= 1e-5).all()  # float32: exact or within a few units in the last place
    assert (frame["allreduces"] == 2).all()  # g forward + f backward
    # each rank's weight gradients are its own slice of the whole block's: W1 (64 x 128) by columns
    assert set(frame[frame.tensor == "dW1"]["shape"].map(tuple)) == {(64, 128)}
    assert set(frame[frame.tensor == "dW2"]["shape"].map(tuple)) == {(128, 64)}


@pytest.mark.distributed
def test_without_f_only_the_input_gradient_is_wrong():
    frame = mg.run_backward_check(2, size=(8, 64), dtypes=("float32",), timeout_s=60, use_f=False)
    by_tensor = frame.groupby("tensor")["ok"].all()
    assert not by_tensor["dx"], "without f each rank's dL/dx is a partial sum and must fail"
    assert by_tensor.drop("dx").all(), "the forward pass and the weights' gradients do not need f"
    assert (frame["allreduces"] == 1).all()


@pytest.mark.distributed
def test_a_layer_of_attention_and_mlp_makes_four_allreduces_per_step():
    per_rank = mg.run_layer_step(2, size=(8, 64), heads=4, timeout_s=60)
    for r in per_rank:
        assert [(e["op"], e["pass"]) for e in r["log"]] == [("g", "forward"), ("g", "forward"),
                                                             ("f", "backward"), ("f", "backward")]
        assert len(r["log"]) == mg.allreduces_per_step()
        assert all(e["bytes"] == 8 * 64 * 4 and e["world_size"] == 2 for e in r["log"])
        assert r["out_max_rel"] <= r["tolerance"] and r["dx_max_rel"] <= r["tolerance"]


def test_launchers_refuse_bad_counts_before_starting():
    with pytest.raises(LabInputError, match="nproc=3"):
        mg.run_backward_check(3, size=(8, 64))
    with pytest.raises(LabInputError, match="heads=5"):
        mg.run_layer_step(2, size=(8, 64), heads=5)
    with pytest.raises(LabInputError, match="dtypes='float8'"):
        mg.run_backward_check(2, dtypes=("float8",))


@pytest.mark.distributed
def test_tp_check_reports_the_backward_check_beside_the_forward_one(capsys):
    from labutils.cli import main

    assert main(["tp-check", "--dtypes", "float32", "--batch", "4", "--hidden", "32"]) == 0
    out = capsys.readouterr().out
    forward, backward = out.split("backward (f and g)")
    assert "forward: the output" in forward and "max_rel" in forward
    for name in ("dx", "dW1", "db1", "dW2", "db2"):
        assert f" {name} " in backward
    assert "counted: 2" in backward
    assert out.strip().endswith("PASS")
