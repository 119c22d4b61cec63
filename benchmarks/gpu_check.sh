#!/usr/bin/env bash
# The GPU paths of the all-reduce lab, checked on a machine with NVIDIA GPUs in under 5 minutes:
#   1. the CUDA-event timer agrees with a synchronised host clock (and an unsynchronised one does not);
#   2. copy bandwidth host<->GPU and GPU<->GPU (labutils.copies);
#   3. the NCCL all_reduce sweep with one rank per GPU (when there are at least 2 GPUs);
#   4. gloo on CUDA tensors on the same ranks, and the NCCL / gloo busbw ratio (the article's ~13x).
# Prints every result; exits non-zero when a step fails.
#
#   bash benchmarks/gpu_check.sh            # from the repository root
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
export LAB_RESULTS_DIR=${LAB_RESULTS_DIR:-$(mktemp -d)}
OUT=$(mktemp -d)
status=0
step() { echo; echo "=== $*"; }
fail() { echo "FAIL: $*"; status=1; }

step "GPUs"
nvidia-smi -L || fail "nvidia-smi -L"
nvidia-smi topo -m || true
NGPU=$("$PY" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)')
echo "torch sees $NGPU GPU(s)"
if [ "$NGPU" -lt 1 ]; then
  fail "no CUDA GPU visible to torch"
  exit 1
fi

step "1. CUDA-event timer against host clocks"
timeout 60 "$PY" - <<'EOF' || fail "timer check"
import time, torch
from labutils.timing import time_loop
a = torch.randn(4096, 4096, device="cuda")
fn = lambda: a @ a
for _ in range(3):
    fn()
events_ms = time_loop(fn, 20, "cuda", sync_ranks=False)
torch.cuda.synchronize(); t0 = time.perf_counter()
for _ in range(20):
    fn()
torch.cuda.synchronize(); synced_ms = (time.perf_counter() - t0) / 20 * 1e3
t0 = time.perf_counter()
for _ in range(20):
    fn()
unsynced_ms = (time.perf_counter() - t0) / 20 * 1e3
torch.cuda.synchronize()
print(f"4096^2 matmul: CUDA events {events_ms:.3f} ms, synced perf_counter {synced_ms:.3f} ms, "
      f"unsynced perf_counter {unsynced_ms:.3f} ms (measures the launch only)")
assert abs(events_ms / synced_ms - 1) < 0.15, "CUDA events and the synchronised clock disagree by more than 15%"
print("PASS timer")
EOF

step "2. copy bandwidth"
timeout 90 "$PY" - <<'EOF' || fail "copy bandwidth"
from labutils.copies import measure_copies
frame = measure_copies(256 << 20, iters=10, progress=False)
print(frame.to_string(index=False))
assert (frame["GBps"] > 0).all()
print("PASS copies")
EOF

if [ "$NGPU" -ge 2 ]; then
  step "3. NCCL all_reduce sweep, $NGPU ranks"
  timeout 150 "$PY" -m labutils sweep --backend nccl --nproc "$NGPU" --min-bytes 1K --max-bytes 256M \
    --budget-ms 50 --no-progress --json > "$OUT/nccl.json" || fail "NCCL sweep"
  "$PY" -m labutils sweep --backend nccl --nproc "$NGPU" --min-bytes 64M --max-bytes 64M --budget-ms 50 \
    --no-progress --no-save || fail "NCCL table"
  step "4. gloo on CUDA tensors, 2 ranks, and the ratio"
  timeout 120 "$PY" -m labutils sweep --backend gloo --device cuda --nproc 2 --min-bytes 1K --max-bytes 64M \
    --budget-ms 50 --no-progress --json > "$OUT/gloo.json" || fail "gloo-on-CUDA sweep"
  "$PY" - "$OUT/nccl.json" "$OUT/gloo.json" <<'EOF' || fail "NCCL/gloo comparison"
import json, sys
nccl = {r["size_bytes"]: r for r in json.load(open(sys.argv[1]))}
gloo = {r["size_bytes"]: r for r in json.load(open(sys.argv[2]))}
print(f"{'size':>10} {'NCCL GB/s':>10} {'gloo GB/s':>10} {'ratio':>7}")
for size in sorted(set(nccl) & set(gloo)):
    a, b = nccl[size]["busbw_GBps"], gloo[size]["busbw_GBps"]
    print(f"{size:>10} {a:>10.2f} {b:>10.2f} {a / b if b else float('inf'):>7.1f}")
assert all(r["wrong"] == 0 for r in list(nccl.values()) + list(gloo.values())), "wrong elements"
top = max(set(nccl) & set(gloo))
print(f"PASS at {top} bytes NCCL is {nccl[top]['busbw_GBps'] / gloo[top]['busbw_GBps']:.1f}x gloo on CUDA")
EOF
else
  step "3-4. one GPU: NCCL needs one GPU per rank; gloo on CUDA with 2 ranks sharing it"
  timeout 120 "$PY" -m labutils sweep --backend gloo --device cuda --nproc 2 --min-bytes 1K --max-bytes 64M \
    --budget-ms 50 --no-progress --no-save || fail "gloo-on-CUDA sweep"
fi

echo
[ "$status" -eq 0 ] && echo "gpu_check: all steps passed" || echo "gpu_check: some steps FAILED"
exit "$status"
