"""The ground floor: input checks, units, the nccl-tests vocabulary and its bandwidth arithmetic, result
files. Imports no other layer, and never torch."""
