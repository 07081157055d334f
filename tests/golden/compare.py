"""Compares a run's curve with its golden curve (tests/golden/golden.sh).

usage: compare.py exact|close GOLDEN NEW

exact: every record and field equal, bit for bit (the machine that recorded
the curves: same CPU, same GEMM kernels).
close: on another machine, where GEMM kernels and vector widths round
differently: the same records and fields; counters (step, bytes, rounds) and
the LR equal; every other number within a relative tolerance of its field
(below) that a rounding-level difference over 20 steps stays well inside, and
a wrong gradient, optimizer or sync does not. Exit 0 when they agree, 1 with
the first disagreement otherwise.
"""
import json
import sys

EXACT = {"step", "comm_bytes", "comm_wire_bytes", "comm_rounds", "lr", "skipped_steps", "overflows", "loss_scale"}
# Relative tolerance per field, the default for the rest. Measured between
# two CPUs (AMD EPYC and Intel Xeon, the same build of 5e2b830, all 29
# cases): losses differ by <= 1e-5 relative, grad norms by <= 4.3e-3 (bf16:
# 1.9e-2, its rounding amplifies the differences). The
# expert loads (and the balance loss made of them) count discrete routing
# decisions, which a last-bit difference flips (bf16: a minimum load of 0.29
# on one, 0.43 on the other): only the exact mode compares the loads.
TOLERANCE = {"grad_norm": 5e-2, "consensus_distance": 5e-2, "loss_aux": 5e-2}
DEFAULT = 1e-3
ROUTING = {"expert_load_cv", "expert_load_max", "expert_load_min", "expert_tokens", "expert_dropped"}
# Fields a run may report that curves recorded before them lack (new
# measurements of the same model; they move nothing else). Where both have
# one, it is compared like any other field.
ADDED = {"val_bpb": "9/13: bits per byte, val_loss / ln 2 for byte corpora",
         "val_acc": "10/13: next-token accuracy of the validation windows",
         "expert_tokens": "12/13: tokens per routed expert, summed over the MoE layers and ranks",
         "comm_wire_bytes": "bytes on the wire under each collective's bandwidth-optimal algorithm"}


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def close(a, b, tol):
    return abs(a - b) <= tol * max(abs(a), abs(b), 1e-6)


def main():
    mode, golden_path, new_path = sys.argv[1:4]
    golden, new = load(golden_path), load(new_path)
    if len(golden) != len(new):
        print(f"{len(new)} records, the golden curve has {len(golden)}")
        return 1
    worst = {}
    for i, (g, n) in enumerate(zip(golden, new)):
        only_new = set(n) - set(g)
        if set(g) - set(n) or only_new - set(ADDED):
            print(f"record {i + 1}: fields {sorted((set(g) ^ set(n)) - set(ADDED))} in only one of them")
            return 1
        for field, gv in g.items():
            nv = n[field]
            if mode == "close" and field in ROUTING:
                continue
            numbers = isinstance(gv, (int, float)) and not isinstance(gv, bool)
            per_rank = isinstance(gv, list) and isinstance(nv, list) and len(gv) == len(nv)
            if mode == "exact" or field in EXACT or not (numbers or per_rank):
                if gv != nv:
                    print(f"record {i + 1} (step {g.get('step')}): {field} {nv!r}, golden {gv!r}")
                    return 1
                continue
            tol = TOLERANCE.get(field, DEFAULT)
            for a, b in zip(gv, nv) if per_rank else [(gv, nv)]:
                if not close(a, b, tol):
                    print(f"record {i + 1} (step {g.get('step')}): {field} {nv!r}, golden {gv!r} "
                          f"(beyond the relative tolerance {tol})")
                    return 1
                worst[field] = max(worst.get(field, 0.0), abs(a - b) / max(abs(a), abs(b), 1e-6))
    if mode == "close" and worst:
        top = sorted(worst.items(), key=lambda kv: -kv[1])[:3]
        print("largest relative differences: " + ", ".join(f"{k} {v:.1e}" for k, v in top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
