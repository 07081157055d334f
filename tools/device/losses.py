#!/usr/bin/env python3
"""The loss curves the GPU checks compare (tools/device/checks.sh, tools/device-check --record-cpu).
Standard library only: it runs under the GPU machine's python3 and Debian's.
  losses.py curve RUN_DIR                      "step loss" per line (17 digits) from RUN_DIR/metrics.jsonl
  losses.py follows REF RUN NAME_REF NAME_RUN  within 1e-4 relative at every step of REF: exit 0, else 1
REF and RUN are curve files; lines starting with # are comments."""
import json
import sys

TOLERANCE = 1e-4


def curve(run_dir):
    for line in open(f"{run_dir}/metrics.jsonl"):
        r = json.loads(line)
        if "loss" in r and "step" in r:
            print(r["step"], repr(float(r["loss"])))
    return 0


def read(path):
    return {int(s): float(v) for s, v in (l.split() for l in open(path) if l.strip() and not l.startswith("#"))}


def follows(ref_path, run_path, name_ref, name_run):
    ref, run = read(ref_path), read(run_path)
    worst, at = 0.0, 0
    for step, want in ref.items():
        if step not in run:
            print(f"step {step} missing from the {name_run} run")
            return 1
        rel = abs(run[step] - want) / abs(want)
        if rel > worst:
            worst, at = rel, step
    print(f"{len(ref)} steps, largest relative difference {worst:.2e} at step {at} (allowed {TOLERANCE:g}); "
          f"last loss {name_ref} {ref[max(ref)]:.6f} {name_run} {run[max(ref)]:.6f}")
    return 0 if worst <= TOLERANCE else 1


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "curve":
        sys.exit(curve(sys.argv[2]))
    if len(sys.argv) == 6 and sys.argv[1] == "follows":
        sys.exit(follows(*sys.argv[2:]))
    sys.exit(__doc__)
