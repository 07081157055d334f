#!/usr/bin/python3
# tools/lab/ablate --resume after a longer look (no runs): results.json holds finished cases of seeds 1..8, and
# the command asks seeds 1..5 (the verdict suite's first look, run again after its 8-seed second look). The
# cases of seeds 6..8 and their folders must stay; an unfinished case of the command's seeds is removed to run
# again; the table and the exit status count the command's seeds only.
#   usage: /usr/bin/python3 tests/test_ablate_resume.py   (ctest: ablate_resume)
import json
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools", "lab"))
import ablate_lib  # noqa: E402

FAILS = []


def check(cond, what):
    if not cond:
        FAILS.append(what)
        print(f"FAIL: {what}")


with tempfile.TemporaryDirectory() as out:
    binary = os.path.join(out, "xuanxue")
    with open(binary, "w") as f:
        f.write("a binary")
    variants = [{"name": "base", "lines": []}, {"name": "trick", "lines": ["lossagg robust"]}]
    cfg = {"deck": "input/tiny.deck", "variants": variants, "ranks": 2, "steps": 4, "vars": {}, "common": [],
           "eval_every": 2, "launcher": "mpiexec", "mpirun_args": [], "reload": False, "order": "seed-major",
           "network": None, "storage": None, "bin": binary, "out": out, "target_loss": None,
           "seeds": [1, 2, 3, 4, 5, 6, 7, 8], "title": "t"}
    cases = []
    for seed in cfg["seeds"]:
        for v in variants:
            rel = os.path.join(v["name"], f"seed{seed}")
            os.makedirs(os.path.join(out, rel))
            loss = 5.0 + seed / 100 + (0.01 if v["name"] == "trick" else 0)
            with open(os.path.join(out, rel, "metrics.jsonl"), "w") as f:
                for step in (1, 2, 3, 4):
                    f.write(json.dumps({"step": step, "loss": loss, "val_loss": loss, "tokens": 64 * step,
                                        "time_s": 0.1 * step}) + "\n")
            unfinished = seed == 2 and v["name"] == "trick"  # it failed: to run again
            cases.append({"variant": v["name"], "seed": seed, "dir": rel, "rc": 1 if unfinished else 0,
                          "wall_s": 1.0, "summary": {"train_loss": loss, "val_loss": loss}})
    ablate_lib.write_results(cfg, cases)

    first_look = dict(cfg, seeds=[1, 2, 3, 4, 5])
    kept = ablate_lib.kept_cases(first_look)
    seeds_kept = sorted({c["seed"] for c in kept})
    check(seeds_kept == [1, 2, 3, 4, 5, 6, 7, 8], f"finished cases of every seed kept (kept seeds {seeds_kept})")
    check(len(kept) == 15, f"15 finished cases kept (got {len(kept)})")
    for seed in (6, 7, 8):
        for v in variants:
            check(os.path.isdir(os.path.join(out, v["name"], f"seed{seed}")), f"{v['name']}/seed{seed} kept on disk")
    check(not os.path.isdir(os.path.join(out, "trick", "seed2")), "the unfinished trick/seed2 removed to run again")
    check(os.path.isdir(os.path.join(out, "base", "seed2")), "the finished base/seed2 kept")

    mine = ablate_lib.of_seeds(first_look, kept)
    check(sorted({c["seed"] for c in mine}) == [1, 2, 3, 4, 5], "of_seeds: the command's seeds only")
    summary = ablate_lib.variant_summary(first_look, kept)
    check(summary["base"]["cases"] == 5 and summary["base"]["of"] == 5,
          f"the table counts the command's 5 seeds (base: {summary['base']['cases']} of {summary['base']['of']})")
    check(summary["trick"]["cases"] == 4, f"trick: 4 finished of the 5 seeds (got {summary['trick']['cases']})")

    # What a second run of the command writes keeps seeds 6..8 for the 8-seed look that follows it.
    ablate_lib.write_results(first_look, kept)
    again = ablate_lib.kept_cases(dict(cfg))
    check(sorted({c["seed"] for c in again}) == cfg["seeds"], "the 8-seed look finds seeds 6..8 still finished")

if FAILS:
    print(f"{len(FAILS)} check(s) failed")
    sys.exit(1)
print("ablate --resume: finished cases of other seeds kept, the command's seeds judged")
