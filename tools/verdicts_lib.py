# tools/verdicts_lib.py: the claims behind tools/verdicts (issue 10/13).
#
# Each piece of folklore is a Claim: one or more ablations (tools/ablate, or
# tools/netsim for the network's share) of input/verdicts.deck, and the Tests
# that pair their cases by seed and give a verdict on the claim's own metric
# (tools/verdict_stats.py: the statistics and the stated rule). Nothing here
# runs a rank itself: every case is a tools/ablate case, resumed with
# --resume, so a rerun skips what finished.
#
# Runs with /usr/bin/python3 (matplotlib for the plots only).

import dataclasses
import datetime
import json
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys

TOOLS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TOOLS)
sys.path.insert(0, TOOLS)
import ablate_lib  # noqa: E402
import verdict_stats as vs  # noqa: E402

DECK = os.path.join(ROOT, "input", "verdicts.deck")
SWARM_DECK = os.path.join(ROOT, "input", "verdicts-swarm.deck")
DATA = os.path.join(ROOT, "data", "bpe2k")
UNSTATED = 0.01  # the claimed size where the folklore names none: 1% of the metric


@dataclasses.dataclass
class Scale:
    """How big the runs are: the full suite, or --quick (CI: every claim's machinery, no verdict worth having)."""
    name: str
    seeds: list
    ranks: int      # the ranks of every claim but A6
    swarm_ranks: int
    steps: int      # training claims
    eval_every: int
    speed_steps: int  # the claims that time steps
    ckpt_steps: int   # checkpoint claims, a checkpoint every ckpt_steps/4


FULL = Scale("full", [1, 2, 3, 4, 5], 4, 8, 240, 40, 60, 40)
QUICK = Scale("quick", [1, 2], 2, 4, 10, 5, 8, 8)


@dataclasses.dataclass
class Experiment:
    """One tools/ablate invocation: its variants (the first is the baseline) and options."""
    name: str
    variants: list            # ['NAME: line; line', ...]
    steps: int
    ranks: int
    common: list = dataclasses.field(default_factory=list)
    eval_every: int = 0       # 0: the last step only
    netsim: str = ""          # a rate: the ablation runs under tools/netsim --rate RATE
    reload: bool = False      # each case restarted with -resume auto (timing the load)
    expect_fail: list = dataclasses.field(default_factory=list)
    deck: str = DECK
    vars: dict = dataclasses.field(default_factory=dict)  # -var NAME VALUE (a deck without ${steps})

    def argv(self, out, seeds):
        a = ["--deck", os.path.relpath(self.deck, ROOT), "--ranks", str(self.ranks), "--seeds",
             ",".join(map(str, seeds)), "--out", out, "--resume", "--title", self.name,
             "--eval-every", str(self.eval_every), "--timeout", "900"]
        if self.steps:
            a += ["--steps", str(self.steps)]
        for name, value in self.vars.items():
            a += ["--var", name, str(value)]
        for v in self.variants:
            a += ["--variant", v]
        for c in self.common:
            a += ["--common", c]
        for n in self.expect_fail:
            a += ["--expect-fail", n]
        if self.reload:
            a.append("--reload")
        return a

    def command(self, out, seeds):
        tool = ["tools/netsim", "--rate", self.netsim, "--"] if self.netsim else ["tools/ablate"]
        return tool + self.argv(out, seeds)


@dataclasses.dataclass
class Test:
    """One verdict row: `metric` of variant against baseline (same experiment), paired by seed.

    rule: superiority (size: the claimed signed change), non_inferiority (size: the margin, its sign the
    worse side), identical (every pair bit-identical), caught (the variant's cases fail with `expect`,
    the baseline's run on). relative: sizes and effects are fractions of the baseline's value."""
    row: str
    experiment: str
    baseline: str
    variant: str
    metric: str
    rule: str
    size: float = 0.0
    relative: bool = True
    expect: str = ""


@dataclasses.dataclass
class Claim:
    id: str
    folklore: str
    switch: str
    metric: str
    experiments: list
    tests: list
    scale_note: str = ""


# ---------------------------------------------------------------------------
# the claims


def data_line(**kw):
    """The deck's data line with keywords set (variants replace the whole line)."""
    words = {"batch": 8, "workers": 2}
    words.update(kw)
    return ("data shard '${data}/train_*.bin' valid ${data}/val.bin tokenizer ${data}/tokenizer.model "
            + " ".join(f"{k} {v}" for k, v in words.items()))


def claims(s):
    """The 14 claims at scale `s`."""
    T, E = Test, Experiment
    steps, R, ev = s.steps, s.ranks, s.eval_every
    period = max(2, steps // 5)  # "every 10 epochs": 5 cycles in the run
    contiguous = data_line(partition="contiguous")
    noisy = data_line(noise_rank=R - 1)
    return [
        Claim("A1", "3 local steps : 1 sync keeps convergence and cuts communication ~15%",
              "`sync local 3`", "bytes per rank; val loss at equal steps, and at equal training time (the faster run's; netsim 1gbit)",
              [E("A1", ["dense: sync dense", "local3: sync local 3"], steps, R, eval_every=ev, netsim="1gbit")],
              [T("A1", "A1", "dense", "local3", "comm_bytes", "superiority", -0.15),
               T("A1.2", "A1", "dense", "local3", "val_loss", "non_inferiority", +UNSTATED),
               T("A1.3", "A1", "dense", "local3", "val_loss_at_equal_time", "non_inferiority", +UNSTATED)]),
        Claim("A2", "LR restarts every 10 epochs, ±5% jitter, restart point chosen from the LR history, help "
              "when nodes' data differ", f"`schedule sgdr period {period} jitter 0.05 restart_from best` "
              "(each rank its own slice: `partition contiguous`)", "val loss",
              [E("A2", ["cosine: schedule cosine warmup 20 min_lr 3e-4",
                        f"sgdr-best-jitter: schedule sgdr period {period} min_lr 3e-4 warmup 20 jitter 0.05 restart_from best",
                        f"sgdr-best: schedule sgdr period {period} min_lr 3e-4 warmup 20 restart_from best",
                        f"sgdr-last-jitter: schedule sgdr period {period} min_lr 3e-4 warmup 20 jitter 0.05 restart_from last"],
                 steps, R, common=[contiguous], eval_every=max(period // 2, ev // 2))],
              [T("A2", "A2", "cosine", "sgdr-best-jitter", "val_loss", "superiority", -UNSTATED),
               T("A2.2", "A2", "sgdr-best", "sgdr-best-jitter", "val_loss", "superiority", -UNSTATED),
               T("A2.3", "A2", "sgdr-last-jitter", "sgdr-best-jitter", "val_loss", "superiority", -UNSTATED)],
              f"Epochs are the run's fifths: at {steps} steps, {R} ranks and 512 tokens per rank per step the run sees "
              f"{steps * R * 512 / 0.96e6:.2g} of an epoch of the 0.96M training tokens."),
        Claim("A3", "chaos seeding (per-node seed, reshuffle each epoch, 10% common data on all nodes): ~2% accuracy",
              "`data ... shuffle chaos common 0.1` (each rank its own slice: `partition contiguous`)",
              "val next-token accuracy (points); bits per byte",
              [E("A3", [f"fixed: {contiguous} shuffle fixed",
                        f"chaos: {contiguous} shuffle chaos common 0.1 common_rate 0.1"], steps, R, eval_every=ev)],
              [T("A3", "A3", "fixed", "chaos", "val_acc", "superiority", +0.02, relative=False),
               T("A3.2", "A3", "fixed", "chaos", "val_bpb", "superiority", -UNSTATED)]),
        Claim("A4", "top-k% of gradients plus quantisation: up to 70% less traffic, little accuracy loss",
              "`compress topk R quant int8` (error feedback on)", "bytes per rank, val loss",
              [E("A4", ["dense: compress off", "topk0.1: compress topk 0.1 quant int8",
                        "topk0.01: compress topk 0.01 quant int8"], steps, R, eval_every=ev)],
              [T("A4", "A4", "dense", "topk0.1", "comm_bytes", "superiority", -0.70),
               T("A4.2", "A4", "dense", "topk0.1", "val_loss", "non_inferiority", +UNSTATED),
               T("A4.3", "A4", "dense", "topk0.01", "comm_bytes", "superiority", -0.70),
               T("A4.4", "A4", "dense", "topk0.01", "val_loss", "non_inferiority", +UNSTATED)]),
        Claim("A5", "fused checkpoints (base + per-node diffs) cut checkpoint time 40%",
              "`checkpoint mode diff codec lossless` against `mode full` (collective) and `mode full writer rank0`",
              "write time, restore time, bytes",
              [E("A5", [f"full: checkpoint every {s.ckpt_steps // 4} mode full",
                        f"diff: checkpoint every {s.ckpt_steps // 4} mode diff codec lossless",
                        f"rank0: checkpoint every {s.ckpt_steps // 4} mode full writer rank0"],
                 s.ckpt_steps, R, common=["sync local 4"], reload=True)],
              [T("A5", "A5", "full", "diff", "ckpt_write_s", "superiority", -0.40),
               T("A5.2", "A5", "full", "diff", "ckpt_load_s", "superiority", -0.40),
               T("A5.3", "A5", "full", "diff", "ckpt_bytes", "superiority", -0.40),
               T("A5.4", "A5", "rank0", "diff", "ckpt_write_s", "superiority", -0.40)],
              "Ranks differ only where a strategy lets them: `sync local 4` (every rank's own weights and "
              "moments between syncs) in every variant."),
        Claim("A6", "swarm topology: full → random clusters of 4 → full",
              "input/verdicts-swarm.deck: `topology full`, `topology clusters C redraw D`, `topology full` (phases of "
              "1/5, 3/5, 1/5 of the steps; clusters of C = half the ranks) against `topology full` throughout",
              "val loss; bytes per rank; consensus distance",
              [E("A6", ["full: topology full", "swarm:"], 0, s.swarm_ranks, eval_every=ev, deck=SWARM_DECK,
                 vars={"early": steps // 5, "middle": steps - 2 * (steps // 5), "late": steps // 5,
                       "clusters": s.swarm_ranks // 2, "redraw": max(1, steps // 30)})],
              [T("A6", "A6", "full", "swarm", "val_loss", "non_inferiority", +UNSTATED),
               T("A6.2", "A6", "full", "swarm", "comm_bytes", "superiority", -UNSTATED)],
              "comm_bytes counts what a rank hands to the transport (the buffer it all-reduces), not what a ring "
              "puts on the wire (2(N-1)/N of it), so a cluster of 4 shows the same bytes per step as 8 ranks; "
              "leaving the clusters adds one global average. On the wire a ring of 4 sends 0.86x a ring of 8."),
        Claim("A7", "multi-view loss aggregation stops mid-training oscillation",
              "`lossagg robust` (a rank's loss far from the others' median is trimmed)",
              "oscillation (sd of step-to-step loss changes, middle third); val loss; clean, and one rank fed noise",
              [E("A7", ["off: lossagg off", "robust: lossagg robust"], steps, R, eval_every=ev),
               E("A7-noisy", ["off: lossagg off", "robust: lossagg robust"], steps, R, eval_every=ev,
                 common=[noisy])],
              [T("A7", "A7", "off", "robust", "oscillation", "superiority", -0.25),
               T("A7.2", "A7-noisy", "off", "robust", "oscillation", "superiority", -0.25),
               T("A7.3", "A7-noisy", "off", "robust", "val_loss", "superiority", -UNSTATED),
               T("A7.4", "A7", "off", "robust", "val_loss", "non_inferiority", +UNSTATED)]),
        Claim("B1", "check every parameter has a gradient before the sync", "`grad_check missing error`",
              "ms per step; a detached parameter caught",
              [E("B1", ["off: grad_check missing off", "error: grad_check missing error"], s.speed_steps, R),
               E("B1-detach", ["off: grad_check missing off; fault detach rank 1 step 3",
                               "error: grad_check missing error; fault detach rank 1 step 3"],
                 s.speed_steps, R, expect_fail=["error"])],
              [T("B1", "B1", "off", "error", "ms_per_step", "non_inferiority", +0.02),
               T("B1.2", "B1-detach", "off", "error", "detached_caught", "caught", expect="no gradient reached")]),
        Claim("B2", "seed = base + rank, deterministic algorithms", "one `seed`; `shuffle independent` for a "
              "per-rank data stream", "reruns bit-identical; val loss with per-rank streams",
              [E("B2", ["run:", "rerun:",
                        f"per-rank: {data_line(shuffle='independent')}"], steps, R, eval_every=ev)],
              [T("B2", "B2", "run", "rerun", "loss_curve", "identical"),
               T("B2.2", "B2", "run", "per-rank", "val_loss", "non_inferiority", +UNSTATED)]),
        Claim("B3", "2 loader workers beat 4", "`data ... workers 2` against `workers 4`", "training tokens/s",
              [E("B3", [f"w4: {data_line(workers=4)}", f"w2: {data_line(workers=2)}"], s.speed_steps, R)],
              [T("B3", "B3", "w4", "w2", "tokens_per_s", "superiority", +UNSTATED)]),
        Claim("B4", "clip only after unscaling", "fp16 with `clip_order scaled` (the wrong order) against `unscaled`",
              "val loss",
              [E("B4", ["unscaled: precision fp16 products widened clip_order unscaled",
                        "scaled: precision fp16 products widened clip_order scaled"], steps, R, eval_every=ev)],
              [T("B4", "B4", "unscaled", "scaled", "val_loss", "superiority", +UNSTATED)]),
        Claim("B5", "only rank 0 saves, all ranks load", "`checkpoint ... writer rank0` against `writer collective`",
              "save time, load time",
              [E("B5", [f"collective: checkpoint every {s.ckpt_steps // 4} writer collective",
                        f"rank0: checkpoint every {s.ckpt_steps // 4} writer rank0"], s.ckpt_steps, R,
                 common=["sync local 4"], reload=True)],
              [T("B5", "B5", "collective", "rank0", "ckpt_write_s", "non_inferiority", +0.10),
               T("B5.2", "B5", "collective", "rank0", "ckpt_load_s", "non_inferiority", +0.10)]),
        Claim("B6", "per-rank logs, rank-0 metrics, a barrier after logging", "`output ... barrier on`",
              "ms per step (a barrier after every logged step)",
              [E("B6", ["off: variable barrier off", "on: variable barrier on"], s.speed_steps, R)],
              [T("B6", "B6", "off", "on", "ms_per_step", "non_inferiority", +0.02)]),
        Claim("B7", "signal handlers, periodic health all-reduce, tell the others on error",
              "`health every 1`", "ms per step; seconds from a SIGKILLed rank to the job's end",
              [E("B7", ["off: health every 0", "every1: health every 1"], s.speed_steps, R),
               E("B7-kill", ["off: health every 0; fault kill rank 1 step 3",
                             "every1: health every 1; fault kill rank 1 step 3"], s.speed_steps, R,
                 expect_fail=["off", "every1"])],
              [T("B7", "B7", "off", "every1", "ms_per_step", "non_inferiority", +0.02),
               T("B7.2", "B7-kill", "off", "every1", "end_after_kill_s", "superiority", -0.25)]),
    ]


# ---------------------------------------------------------------------------
# the metrics of one case (its folder: metrics.jsonl, console.txt, ckpt/, rank logs)


def records(case_dir):
    return ablate_lib.read_metrics(os.path.join(case_dir, "metrics.jsonl"))


def text(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def last_eval(case_dir, key):
    vals = [r[key] for r in records(case_dir) if key in r]
    return vals[-1] if vals else None


def step_ms(case_dir, skip=3):
    """Median ms per step after the first `skip` steps (start-up's allocations, oneDNN's JIT): the
    median, so that a burst of the shared machine's noise does not decide an overhead of 2%."""
    ms = [r["ms_per_step"] for r in records(case_dir) if "ms_per_step" in r and r["step"] > skip]
    return statistics.median(ms) if ms else None


def oscillation(case_dir):
    """The spread of the training loss from step to step over the middle third of the run: the sample
    standard deviation of L(t+1) - L(t), L the next-token loss (loss_main) logged at every step."""
    loss = [ablate_lib.main_loss(r) for r in records(case_dir) if "loss" in r]
    n = len(loss)
    mid = loss[n // 3: 2 * n // 3 + 1]
    d = [b - a for a, b in zip(mid, mid[1:])]
    return statistics.stdev(d) if len(d) > 1 else None


def checkpoint_write_s(case_dir):
    """Median of the `write X s` figures of the case's checkpoint lines (the first write of a process pays
    HDF5's and the file system's first touches)."""
    w = [float(x) for x in re.findall(r"^checkpoint .*?write ([0-9.]+) s", text(os.path.join(case_dir, "console.txt")),
                                      re.M)]
    return statistics.median(w) if w else None


def checkpoint_load_s(case_dir):
    """The reload's `resumed from ... in X s` (rank 0 reads the file, every rank gets its state)."""
    m = re.search(r"^resumed from .*?in ([0-9.]+) s", text(os.path.join(case_dir, "console_reload.txt")), re.M)
    return float(m.group(1)) if m else None


def checkpoint_bytes(case_dir):
    files = [os.path.join(case_dir, "ckpt", f) for f in os.listdir(os.path.join(case_dir, "ckpt"))
             if f.startswith("step_") and f.endswith(".h5")] if os.path.isdir(os.path.join(case_dir, "ckpt")) else []
    return statistics.fmean(os.path.getsize(f) for f in files) if files else None


def end_after_kill_s(case_dir, case):
    """Seconds from the fault's injection (its rank log's `unix time T`) to the end of mpirun."""
    for name in sorted(os.listdir(case_dir)):
        m = re.search(r"fault kill injected at step \d+ \(unix time ([0-9.]+)\)",
                      text(os.path.join(case_dir, name, "log.txt")))
        if m and case.get("end_unix"):
            return case["end_unix"] - float(m.group(1))
    return None


def metric(name, case_dir, case):
    if name in ("val_loss", "val_acc", "val_bpb"):
        return last_eval(case_dir, name)
    if name in ("comm_bytes", "tokens_per_s"):
        return (case.get("summary") or {}).get(name)
    return {"ms_per_step": lambda: step_ms(case_dir), "oscillation": lambda: oscillation(case_dir),
            "ckpt_write_s": lambda: checkpoint_write_s(case_dir), "ckpt_load_s": lambda: checkpoint_load_s(case_dir),
            "ckpt_bytes": lambda: checkpoint_bytes(case_dir),
            "end_after_kill_s": lambda: end_after_kill_s(case_dir, case)}[name]()


def val_at(case_dir, seconds):
    """val_loss of the last eval reached within `seconds` of training time (train s as tools/ablate counts it)."""
    elapsed, prev, best = 0.0, 0, None
    for r in records(case_dir):
        if "ms_per_step" in r:
            elapsed += (r["step"] - prev) * r["ms_per_step"] / 1e3
            prev = r["step"]
        if "val_loss" in r and elapsed <= seconds * (1 + 1e-9):
            best = r["val_loss"]
    return best


METRIC_UNITS = {"comm_bytes": "bytes", "val_loss": "nats", "val_loss_at_equal_time": "nats", "val_acc": "",
                "val_bpb": "bits/byte", "oscillation": "nats", "ms_per_step": "ms", "tokens_per_s": "tok/s",
                "ckpt_write_s": "s", "ckpt_load_s": "s", "ckpt_bytes": "bytes", "end_after_kill_s": "s"}


# ---------------------------------------------------------------------------
# a verdict from the cases of an experiment


def cases_by(out_dir):
    """{(variant, seed): case} of an ablation's results.json (empty when it never ran)."""
    path = os.path.join(out_dir, ablate_lib.RESULTS)
    if not os.path.isfile(path):
        return {}
    with open(path) as f:
        doc = json.load(f)
    return {(c["variant"], c["seed"]): c for c in doc["cases"]}


def judge(test, out_dir, seeds):
    """The row of one test: the paired values, the effect and the verdict (or why there is none)."""
    cases = cases_by(out_dir)
    row = {"row": test.row, "metric": test.metric, "baseline": test.baseline, "variant": test.variant,
           "rule": test.rule, "size": test.size, "relative": test.relative}
    pairs = []
    for seed in seeds:
        b, v = cases.get((test.baseline, seed)), cases.get((test.variant, seed))
        if not b or not v:
            continue
        bd, vd = os.path.join(out_dir, b["dir"]), os.path.join(out_dir, v["dir"])
        if test.rule == "identical":
            lb = [(r["step"], r["loss"]) for r in records(bd) if "loss" in r]
            lv = [(r["step"], r["loss"]) for r in records(vd) if "loss" in r]
            if b.get("rc") == 0 and v.get("rc") == 0 and lb:
                pairs.append((seed, len(lb), lb == lv))
        elif test.rule == "caught":
            caught = v.get("rc") not in (0, None, "timeout") and test.expect in text(os.path.join(vd, "console.txt"))
            pairs.append((seed, b.get("rc") == 0, caught))
        else:
            if test.metric == "val_loss_at_equal_time":
                # equal wall time: the faster run's training time; each run's last val loss within it
                tb, tv = (b.get("summary") or {}).get("train_s"), (v.get("summary") or {}).get("train_s")
                horizon = min(tb, tv) if tb and tv else None
                x = (val_at(bd, horizon), val_at(vd, horizon)) if horizon else (None, None)
            else:
                x = (metric(test.metric, bd, b), metric(test.metric, vd, v))
            if None not in x:
                pairs.append((seed,) + x)
    row["pairs"] = pairs
    row["n"] = len(pairs)
    if test.rule == "identical":
        row["verdict"] = ("no data" if not pairs else "confirmed" if all(p[2] for p in pairs) else "refuted")
        row["effect_text"] = f"{sum(p[2] for p in pairs)} of {len(pairs)} reruns bit-identical" if pairs else "-"
        return row
    if test.rule == "caught":
        ok = [p for p in pairs if p[1] and p[2]]
        row["verdict"] = "no data" if not pairs else "confirmed" if len(ok) == len(pairs) else "refuted"
        row["effect_text"] = (f"caught in {sum(p[2] for p in pairs)} of {len(pairs)} runs with the check; "
                              f"{sum(p[1] for p in pairs)} of {len(pairs)} without it ran on unaware") if pairs else "-"
        return row
    if len(pairs) < 2:
        row["verdict"], row["effect_text"] = "no data", f"{len(pairs)} pair(s) (expected at least 2)"
        return row
    base = [p[1] for p in pairs]
    var = [p[2] for p in pairs]
    effect = vs.paired(base, var, relative=test.relative)
    rule = vs.superiority if test.rule == "superiority" else vs.non_inferiority
    row["effect"] = effect
    row["verdict"] = rule(effect, test.size)
    row["effect_text"] = vs.describe(effect, row["verdict"]).split(":")[0]
    row["baseline_mean"] = statistics.fmean(base)
    row["variant_mean"] = statistics.fmean(var)
    return row


# ---------------------------------------------------------------------------
# the words of a verdict


RULES = {
    "superiority": "claimed: the variant changes the metric by {size}. confirmed: the 95% interval of the paired "
                   "differences lies on the claimed side of 0 and reaches {size}; confirmed, smaller than claimed: "
                   "on that side but short of {size}; refuted: it excludes {size} and is not on that side; "
                   "inconclusive: it holds both 0 and {size}",
    "non_inferiority": "claimed: the variant is no worse than a margin of {size}. confirmed: the interval lies on "
                       "the good side of the margin; refuted: beyond it; inconclusive: it holds the margin",
    "identical": "claimed: the same deck, seed and world size give the same bits. confirmed: every rerun's loss "
                 "equals the first run's at every step",
    "caught": "claimed: the check ends a run whose parameter gets no gradient. confirmed: every run with the check "
              "failed naming the tensor, every run without it went on",
}


def size_text(row):
    s = row["size"]
    return f"{s * 100:+g}%" if row["relative"] else f"{s:+g}"


def fmt_value(x, metric):
    if x is None:
        return "-"
    if metric in ("comm_bytes", "ckpt_bytes"):
        return f"{x / 1e6:.3g} MB"
    unit = METRIC_UNITS.get(metric, "")
    return f"{x:.4g}" + (f" {unit}" if unit else "")


def why(row):
    """One sentence on the verdict: the two means, the effect, and which side of the claim it fell."""
    if row["rule"] in ("identical", "caught") or "effect" not in row:
        return row.get("effect_text", "")
    e = row["effect"]
    if all(p[1] == p[2] for p in row["pairs"]):
        return (f"{row['metric']} {fmt_value(row['baseline_mean'], row['metric'])} in both: every pair equal bit for "
                "bit, so the switch changed nothing in these runs.")
    pct = 100 if row["relative"] else 1
    unit = "%" if row["relative"] else ""
    lo, hi = e["lo"] * pct, e["hi"] * pct
    base = (f"{row['metric']} {fmt_value(row['baseline_mean'], row['metric'])} → "
            f"{fmt_value(row['variant_mean'], row['metric'])}; the 95% interval [{lo:+.3g}{unit}, {hi:+.3g}{unit}]")
    v = row["verdict"]
    claim = size_text(row)
    if row["rule"] == "non_inferiority":
        return base + {"confirmed": f" stays inside the margin {claim}",
                       "refuted": f" lies beyond the margin {claim}",
                       "inconclusive": f" holds the margin {claim}"}[v] + "."
    return base + {"confirmed": f" is on the claimed side and reaches {claim}",
                   "confirmed, smaller than claimed": f" is on the claimed side but short of {claim}",
                   "refuted": f" excludes {claim}" + (" and lies on the other side of 0" if (e["hi"] <= 0 if row["size"] > 0
                                                                                         else e["lo"] >= 0) else ""),
                   "inconclusive": f" holds both 0 and {claim}; this n detects {e['mde'] * pct:.2g}{unit} or more"}[v] + "."


# ---------------------------------------------------------------------------
# running, results.json, VERDICTS.md and the plots


def git_commit():
    try:
        head = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True).stdout.strip()
        return head + ("+changes" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def machine():
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{cpu}, {len(os.sched_getaffinity(0))} cores, {platform.system()} {platform.release()}"


def ensure_data():
    """The BPE corpus of input/verdicts.deck (data/bpe2k), made from fortunes when missing."""
    if os.path.isfile(os.path.join(DATA, "val.bin")):
        return
    for cmd in (["tools/prepare-data"], ["tools/prepare-data", "--tokenizer", "bpe", "--vocab", "2048", "--out",
                                         DATA, os.path.join(ROOT, "data", "fortunes.txt")]):
        print(f"# verdicts: {shlex.join(cmd)}", flush=True)
        subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)


def run_experiment(exp, out, seeds, log):
    """One ablation, resumed: tools/ablate (or tools/netsim) as a user would run it; its output to `log`."""
    cmd = exp.command(os.path.join(out, exp.name), seeds)
    print(f"# verdicts: {exp.name}: {shlex.join(cmd)}", flush=True)
    with open(log, "a") as f:
        f.write(f"\n# {shlex.join(cmd)}\n")
        f.flush()
        p = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)
    with open(log, errors="replace") as f:
        tail = [l for l in f.read().splitlines() if l.startswith("# case ")][-1:]
    print(f"#   exit status {p.returncode}" + (f"; {tail[0][2:]}" if tail else ""), flush=True)
    return p.returncode


def judge_claim(claim, out, seeds):
    rows = []
    for t in claim.tests:
        exp = next(e for e in claim.experiments if e.name == t.experiment)
        rows.append(judge(t, os.path.join(out, exp.name), seeds))
    return rows


def results_doc(cfg, chosen, out, seeds_of):
    doc = {"tool": "tools/verdicts", "command": cfg["command"], "scale": dataclasses.asdict(cfg["scale"]),
           "commit": git_commit(), "machine": machine(), "date": f"{datetime.datetime.now():%Y-%m-%d %H:%M}",
           "claims": []}
    for c in chosen:
        seeds = seeds_of[c.id]
        doc["claims"].append({"id": c.id, "folklore": c.folklore, "switch": c.switch, "metric": c.metric,
                              "seeds": seeds, "note": c.scale_note,
                              "commands": [shlex.join(e.command(os.path.join(out, e.name), seeds))
                                           for e in c.experiments],
                              "variants": {e.name: e.variants for e in c.experiments},
                              "rows": judge_claim(c, out, seeds)})
    return doc


def write_json(path, doc):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, path)


SCALE_TEXT = """\
## The scale, and what it can and cannot show
Every case trains input/verdicts.deck: deepseek-tiny's architecture (MLA, DeepSeekMoE with 1 shared and
8 routed experts, top-2, the aux-free bias, MTP depth 1) at dim 64, 3 layers, seq 64, batch 8 per rank, on
the SentencePiece BPE text of fortunes (vocab 2048, 1.0M tokens), on {ranks} ranks ({swarm} for A6) sharing
2 cores, {steps} steps for the training claims, {speed} for those that time steps, {ckpt} for the
checkpoint claims; seeds {seeds} (more where stated).

What it can show: whether a switch does what it says on this code (bytes, bits, which run is caught),
what it costs per step here, and effects on the loss of a small model early in training that are larger
than seed-to-seed noise. What it cannot: effects at scale. The model is 10^4 to 10^5 times smaller than
the ones the folklore comes from, trains for less than an epoch, and its ranks share two cores, so
communication is cheap next to compute (A1 and A4 meet a slow network only under tools/netsim, 1 Gbit/s
shared by all ranks), times include oversubscription noise, and a checkpoint is a few MB written to a
page cache rather than to a parallel file system. A verdict here is a verdict about this scale; "refuted"
means refuted here, at this n, by the stated rule."""


def table_row(claim, row, first):
    cells = [row["row"], claim.folklore if first else "〃", claim.switch if first else "〃",
             f"{row['metric']}", f"`{row['baseline']}`", f"`{row['variant']}`",
             row.get("effect_text", "-"), str(row["n"]), f"**{row['verdict']}**", why(row)]
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def verdicts_md(doc, chosen, plots_rel):
    scale = doc["scale"]
    lines = ["# Verdicts: the folklore of distributed training, measured", "",
             "Generated by tools/verdicts; never edited by hand. To regenerate it (resumable: a rerun skips the "
             "cases that finished):", "", "```", doc["command"], "```", "",
             f"Commit {doc['commit']}, {doc['machine']}, {doc['date']}. Scale `{scale['name']}`.", "",
             "Each claim is a paired experiment (tools/ablate: the baseline and its variants on the same seeds, "
             "interleaved seed by seed). The effect is the mean of the paired differences (variant - baseline; "
             "relative ones as a fraction of the baseline) with its 95% t interval; the verdict follows the rule "
             "below. Where the folklore names no size, the claimed size is 1% of the metric.", "",
             "| id | claim | switch | metric | baseline | variant | effect ± 95% CI | n | verdict | why |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    by_id = {c.id: c for c in chosen}
    for c in doc["claims"]:
        for i, row in enumerate(c["rows"]):
            lines.append(table_row(by_id[c["id"]], row, i == 0))
    lines += ["", "## The rule", ""]
    lines += [f"- {k}: {v.format(size='the claimed size')}." for k, v in RULES.items()]
    lines += ["", "The smallest effect a row could detect (80% power, two-sided 5%) is given when it is "
              "inconclusive. tools/verdict_stats.py holds the statistics (ctest verdict_stats checks them on "
              "synthetic pairs with known answers).", "",
              SCALE_TEXT.format(ranks=scale["ranks"], swarm=scale["swarm_ranks"], steps=scale["steps"],
                                speed=scale["speed_steps"], ckpt=scale["ckpt_steps"],
                                seeds=",".join(map(str, scale["seeds"]))), "", "## Each claim", ""]
    for c in doc["claims"]:
        lines += [f"### {c['id']}: {c['folklore']}", "", f"Switch: {c['switch']}. Metric: {c['metric']}. "
                  f"Seeds: {','.join(map(str, c['seeds']))}.", ""]
        if c["note"]:
            lines += [c["note"], ""]
        for name, variants in c["variants"].items():
            lines += [f"- ablation `{name}`: " + "; ".join(f"`{v}`" for v in variants)]
        lines += ["", "```"] + c["commands"] + ["```", ""]
        for row in c["rows"]:
            pairs = ", ".join(f"{p[0]}: " + (f"{fmt_value(p[1], row['metric'])} → {fmt_value(p[2], row['metric'])}"
                                             if row["rule"] not in ("identical", "caught") else
                                             ("same" if p[2] else "differ") if row["rule"] == "identical" else
                                             f"{'caught' if p[2] else 'missed'}, off {'ran' if p[1] else 'failed'}")
                              for p in row["pairs"])
            lines += [f"- {row['row']} ({row['metric']}, {row['baseline']} → {row['variant']}; by seed: {pairs}): "
                      f"**{row['verdict']}**. {why(row)}"]
        if c["id"] in plots_rel:
            lines += ["", f"![{c['id']}]({plots_rel[c['id']]})"]
        lines.append("")
    return "\n".join(lines) + "\n"


def plot_claim(c, out, path):
    """The rows' effects with their intervals and the claimed size; the val loss of the first ablation."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in c["rows"] if "effect" in r]
    exp = next(iter(c["variants"]))  # the claim's first ablation
    cases = cases_by(os.path.join(out, exp))
    curves = {}
    for (variant, seed), case in cases.items():
        vals = [(r["step"], r["val_loss"]) for r in records(os.path.join(out, exp, case["dir"])) if "val_loss" in r]
        if len(vals) > 1 and seed in c["seeds"]:
            curves.setdefault(variant, []).append(dict(vals))
    panels = bool(rows) + bool(curves)
    if not panels:
        return False
    fig, axes = plt.subplots(1, panels, figsize=(6 * panels, 3.5), squeeze=False)
    ax = axes[0]
    i = 0
    if rows:
        a = ax[i]
        i += 1
        for y, r in enumerate(rows):
            e, pct = r["effect"], 100 if r["relative"] else 1
            a.errorbar([e["mean"] * pct], [y], xerr=[[(e["mean"] - e["lo"]) * pct], [(e["hi"] - e["mean"]) * pct]],
                       fmt="o", color="C0", capsize=4)
            a.plot([r["size"] * pct] * 2, [y - 0.3, y + 0.3], color="C3", lw=2)
        a.axvline(0, color="gray", lw=0.8)
        a.set_yticks(range(len(rows)))
        a.set_yticklabels([f"{r['row']} {r['metric']}" + (" %" if r["relative"] else "") for r in rows])
        a.set_xlabel("variant - baseline (dot, 95% CI); red: claimed size or margin")
        a.invert_yaxis()
        a.grid(alpha=0.3)
    if curves:
        a = ax[i]
        for k, (variant, runs) in enumerate(sorted(curves.items())):
            steps = sorted(set.intersection(*(set(r) for r in runs)))
            mean = [statistics.fmean(r[s] for r in runs) for s in steps]
            a.plot(steps, mean, "o-", ms=3, color=f"C{k}", label=f"{variant} (mean of {len(runs)})")
        a.set_xlabel("step")
        a.set_ylabel("val loss")
        a.legend(fontsize=8)
        a.grid(alpha=0.3)
    fig.suptitle(f"{c['id']}: {c['folklore'][:90]}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def report(doc, chosen, out, docs):
    """OUT/results.json, OUT/VERDICTS.md and OUT/verdicts/*.png; with docs, docs/VERDICTS.md and docs/verdicts/."""
    write_json(os.path.join(out, "results.json"), doc)
    targets = [(out, "verdicts")] + ([(os.path.join(ROOT, "docs"), "verdicts")] if docs else [])
    for folder, sub in targets:
        os.makedirs(os.path.join(folder, sub), exist_ok=True)
        plots = {}
        for c in doc["claims"]:
            path = os.path.join(folder, sub, f"{c['id']}.png")
            try:
                if plot_claim(c, out, path):
                    plots[c["id"]] = f"{sub}/{c['id']}.png"
            except Exception as e:  # a missing matplotlib must not cost the table
                print(f"# verdicts: plot {c['id']} not written: {type(e).__name__}: {e}")
        with open(os.path.join(folder, "VERDICTS.md"), "w") as f:
            f.write(verdicts_md(doc, chosen, plots))
    return os.path.join(targets[-1][0], "VERDICTS.md")


def summary_lines(doc):
    out = []
    for c in doc["claims"]:
        for r in c["rows"]:
            out.append(f"{r['row']:<5} {r['verdict']:<32} {r['metric']:<24} {r.get('effect_text', '-')}")
    return out
