"""The pure models: the alpha-beta fit, the time budget for N devices, the ring's arithmetic and the
data-parallel step. Numbers in, numbers out: no torch, no processes, no files."""
