"""The course's experiments on real ranks: the ring by hand, tensor parallelism with Megatron's f and g,
the split layer held against the budget, the data-parallel step and its timeline."""
