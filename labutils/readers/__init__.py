"""Readers of what machines print and hold: nccl-tests logs, NCCL_DEBUG lines, `nvidia-smi topo -m`,
`lspci -vvv`, the CPUs in /sys and the reference link table. Text in, frozen data out; no torch."""
