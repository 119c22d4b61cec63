"""A stand-in for `python -m labutils run-notebooks` in tests of benchmarks/gpu_check.py: the same
options, no notebook executed. What each notebook "does" comes from FAKE_RUNNER_PLAN (JSON):

    {"07_x": {"seconds": 12.5, "ok": true, "figures": {"t2_median_error_pct": 9.0}, "units": {...}},
     "01_y": {"sleep_s": 60, "child_pid_file": "/tmp/p"},   # overruns; starts a process of its own
     "02_z": {"no_summary": true, "exit": 3}}                # dies before writing summary.json

It writes <out>/summary.json as the runner does (one notebook, the --only one) and appends each
call, its options and the LAB_RESULTS_DIR / LAB_GPU_CHECK it saw, as a JSON line to FAKE_RUNNER_CALLS.
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--only", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--notebooks", required=True)
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    plan = json.loads(os.environ.get("FAKE_RUNNER_PLAN", "{}")).get(args.only, {})
    if calls := os.environ.get("FAKE_RUNNER_CALLS"):
        with open(calls, "a") as f:
            f.write(json.dumps({"only": args.only, "out": args.out, "notebooks": args.notebooks, "quick": args.quick,
                                "results_dir": os.environ.get("LAB_RESULTS_DIR"),
                                "marker": os.environ.get("LAB_GPU_CHECK")}) + "\n")
    if pid_file := plan.get("child_pid_file"):  # a process in a session of its own, as a kernel is
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
        Path(pid_file).write_text(str(child.pid))
    time.sleep(plan.get("sleep_s", 0))
    if plan.get("no_summary"):
        return plan.get("exit", 1)
    entry = {"ok": plan.get("ok", True), "seconds": plan.get("seconds", 1.0), "failed_stage": plan.get("failed_stage"),
             "error": plan.get("error", ""), "figures": plan.get("figures", {}), "units": plan.get("units", {})}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps({"quick": args.quick, "stopped": None,
                                                  "notebooks": {args.only: entry}}))
    return 0 if entry["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
