# tools/lab/verdicts_judge.py: from the cases of tools/lab/verdicts to its rows (issue 15/18).
#
# A case (one variant, one seed of a tools/lab/ablate run) is read once into a
# CaseData: its metrics.jsonl records and the few console facts the metrics
# need. The same CaseData is what the archive keeps (docs/verdicts/archive.json.xz),
# so a report rebuilt from the archive judges the same numbers.
#
# A row pairs the baseline's and the variant's cases by seed. Before any
# statistics it asks whether the comparison can say anything:
#   not exercised           every pair's training-loss curve is identical bit for
#                           bit: the switch never acted (for rows whose switch
#                           acts through the numerics, Test.acts = "curve");
#   metric cannot show it   the switch acted (the curves differ) but the metric
#                           is equal in every pair;
#   no data                 fewer than 2 pairs.
# Otherwise the paired statistics of tools/lab/verdict_stats.py give two one-sided
# p-values; the verdict waits for the family adjustment (adjust()).
import dataclasses
import json
import lzma
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ablate_lib  # noqa: E402
import verdict_stats as vs  # noqa: E402

# metrics.jsonl keys the archive keeps (everything a metric below reads)
KEPT_KEYS = ("step", "loss", "loss_main", "val_loss", "val_acc", "val_bpb", "ms_per_step", "tokens_per_s",
             "comm_bytes", "comm_wire_bytes")
FACT_PATTERNS = {  # console lines the metrics read (and, in console_tail, every line the program itself
                 # wrote as an error, "xuanxue: ...", then the last 15)
    "ckpt_write": r"^checkpoint .*?write ([0-9.]+) s",
    "ckpt_stall": r"^checkpoint .*?stall ([0-9.]+) s",
    "ckpt_mb": r"^checkpoint .*?([0-9.]+) MB, write",  # the file's size (rank 0 sees it)
    "restored": r"warm restart: .*, back to step (\d+)",
}


@dataclasses.dataclass
class CaseData:
    variant: str
    seed: int
    rc: object
    summary: dict
    records: list
    facts: dict          # ckpt_write, ckpt_stall: [s], ckpt_mb: [MB], restored, load_s, fault_unix, console_tail, second_job
    end_unix: float = None
    provenance: dict = None
    wall_s: float = None

    def to_json(self):
        return dataclasses.asdict(self)


def _text(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def read_case(out_dir, case):
    """A case of an ablation's results.json, with what its metrics need from its folder."""
    d = os.path.join(out_dir, case["dir"])
    records = [{k: r[k] for k in KEPT_KEYS if k in r} for r in ablate_lib.read_metrics(os.path.join(d, "metrics.jsonl"))]
    console = _text(os.path.join(d, "console.txt"))
    facts = {name: [float(x) for x in re.findall(p, console, re.M)] for name, p in FACT_PATTERNS.items()}
    m = re.search(r"^resumed from .*?in ([0-9.]+) s", _text(os.path.join(d, "console_reload.txt")), re.M)
    facts["load_s"] = float(m.group(1)) if m else None
    facts["fault_unix"] = None
    if os.path.isdir(d):
        for name in sorted(os.listdir(d)):
            m = re.search(r"fault \w+ injected at step \d+ \(unix time ([0-9.]+)\)", _text(os.path.join(d, name, "log.txt")))
            if m:
                facts["fault_unix"] = float(m.group(1))
    lines = console.strip().splitlines()
    facts["console_tail"] = [l for l in lines if l.startswith("xuanxue:")][:20] + lines[-15:]
    second = _text(os.path.join(d, "second_job.txt")).strip().splitlines()  # tools/lab/run-twice
    facts["second_job"] = [l for l in second if l.startswith("xuanxue:")][:5] + second[-2:]
    facts["reload_rc"] = case.get("reload_rc")
    return CaseData(case["variant"], case["seed"], case.get("rc"), case.get("summary") or {}, records, facts,
                    case.get("end_unix"), case.get("provenance"), case.get("wall_s"))


def read_experiment(out_dir):
    """{(variant, seed): CaseData} of an ablation's folder (empty when it never ran)."""
    path = os.path.join(out_dir, ablate_lib.RESULTS)
    if not os.path.isfile(path):
        return {}
    with open(path) as f:
        doc = json.load(f)
    return {(c["variant"], c["seed"]): read_case(out_dir, c) for c in doc["cases"]}


def write_archive(path, experiments, meta):
    """experiments: {name: {(variant, seed): CaseData}}, and what the rows need besides (the seeds and looks
    of each claim) -> one xz-compressed JSON file."""
    doc = {"meta": meta, "experiments": {name: [c.to_json() for c in cases.values()]
                                         for name, cases in experiments.items()}}
    tmp = path + ".tmp"
    with lzma.open(tmp, "wt", preset=9) as f:
        json.dump(doc, f, separators=(",", ":"), sort_keys=True)
    os.replace(tmp, path)


def read_archive(path):
    """(experiments, meta) of write_archive's file."""
    with lzma.open(path, "rt") as f:
        doc = json.load(f)
    return ({name: {(c["variant"], c["seed"]): CaseData(**c) for c in cases}
             for name, cases in doc["experiments"].items()}, doc["meta"])


# ---------------------------------------------------------------------------
# the metrics of one case


def loss_curve(c):
    return [(r["step"], r["loss"]) for r in c.records if "loss" in r]


def last_eval(c, key):
    vals = [r[key] for r in c.records if key in r]
    return vals[-1] if vals else None


def val_at_step(c, step, key="val_loss"):
    """The last eval at or before `step`."""
    vals = [r[key] for r in c.records if key in r and r["step"] <= step]
    return vals[-1] if vals else None


def step_ms(c, skip=3):
    """Median ms per step after the first `skip` (start-up's allocations, oneDNN's JIT)."""
    ms = [r["ms_per_step"] for r in c.records if "ms_per_step" in r and r["step"] > skip]
    return statistics.median(ms) if ms else None


def val_oscillation(c):
    """The spread of the validation loss (fixed held-out batches, evaluated every few steps) from one eval to
    the next over the middle third of the run: the sample sd of V(e+1) - V(e). Minibatch noise does not enter
    (the batches are the same at every eval), and neither does a rank trimmed by lossagg (every rank holds the
    same model)."""
    vals = [r["val_loss"] for r in c.records if "val_loss" in r]
    n = len(vals)
    mid = vals[n // 3: 2 * n // 3 + 1]
    d = [b - a for a, b in zip(mid, mid[1:])]
    return statistics.stdev(d) if len(d) > 1 else None


def train_s(c):
    return c.summary.get("train_s")


def wire_bytes(c):
    """Bytes this rank (rank 0) put on the wire over the run (ring all-reduce: 2(g-1)/g of its buffer)."""
    if not any("comm_wire_bytes" in r for r in c.records):
        return None
    return sum(r.get("comm_wire_bytes", 0) for r in c.records if "loss" in r)


def end_after_fault_s(c):
    """Seconds from the fault's injection to the end of mpirun (a case stopped at its timeout counts up to then)."""
    if c.facts.get("fault_unix") is None or c.end_unix is None:
        return None
    return c.end_unix - c.facts["fault_unix"]


def target_s(c):
    return c.summary.get("target_s")


METRICS = {
    "val_loss": lambda c: last_eval(c, "val_loss"),
    "val_acc": lambda c: last_eval(c, "val_acc"),
    "val_bpb": lambda c: last_eval(c, "val_bpb"),
    "wire_bytes": wire_bytes,
    "comm_bytes": lambda c: c.summary.get("comm_bytes"),
    "tokens_per_s": lambda c: c.summary.get("tokens_per_s"),
    "ms_per_step": step_ms,
    "val_oscillation": val_oscillation,
    "ckpt_write_s": lambda c: statistics.median(c.facts["ckpt_write"]) if c.facts.get("ckpt_write") else None,
    "ckpt_stall_s": lambda c: statistics.median(c.facts["ckpt_stall"]) if c.facts.get("ckpt_stall") else None,
    "ckpt_load_s": lambda c: c.facts.get("load_s"),
    "ckpt_bytes": lambda c: 1e6 * statistics.fmean(c.facts["ckpt_mb"]) if c.facts.get("ckpt_mb") else None,
    "end_after_fault_s": end_after_fault_s,
    "target_s": target_s,
    "train_s": train_s,
}
UNITS = {"val_loss": "nats", "val_acc": "", "val_bpb": "bits/byte", "wire_bytes": "B", "comm_bytes": "B",
         "tokens_per_s": "tok/s", "ms_per_step": "ms", "val_oscillation": "nats", "ckpt_write_s": "s", "ckpt_stall_s": "s",
         "ckpt_load_s": "s", "ckpt_bytes": "B", "end_after_fault_s": "s", "target_s": "s", "train_s": "s"}


def fmt_value(x, metric):
    if x is None:
        return "-"
    if UNITS.get(metric) == "B":
        return f"{x / 1e6:.4g} MB"
    unit = UNITS.get(metric, "")
    return f"{x:.4g}" + (f" {unit}" if unit else "")


# ---------------------------------------------------------------------------
# a row


def compute_margin(cases, baseline, seeds):
    """The loss margin in compute terms: how much worse the baseline's val loss was with 10% fewer steps,
    as a fraction of its final val loss, averaged over its seeds: mean (V(0.9 T) - V(T)) / V(T)."""
    fracs = []
    for seed in seeds:
        c = cases.get((baseline, seed))
        if not c or c.rc != 0:
            continue
        end = max((r["step"] for r in c.records if "val_loss" in r), default=None)
        if end is None:
            continue
        early, last = val_at_step(c, int(0.9 * end)), val_at_step(c, end)
        if early is not None and last:
            fracs.append((early - last) / last)
    return statistics.fmean(fracs) if fracs else None


def judge(test, cases, seeds):
    """The row of one test before the family adjustment: pairs, effect and unadjusted p-values, or the reason
    there is no statistical verdict."""
    row = {"row": test.row, "metric": test.metric, "baseline": test.baseline, "variant": test.variant,
           "rule": test.rule, "scale": test.scale, "primary": test.primary, "source": test.source,
           "size": test.size}
    both = [(seed, cases.get((test.baseline, seed)), cases.get((test.variant, seed))) for seed in seeds]
    both = [(s, b, v) for s, b, v in both if b and v]
    if test.rule == "identical":
        pairs = [(s, len(loss_curve(b)), loss_curve(b) == loss_curve(v)) for s, b, v in both
                 if b.rc == 0 and v.rc == 0 and loss_curve(b)]
        row.update(pairs=pairs, n=len(pairs),
                   verdict="no data" if not pairs else "confirmed" if all(p[2] for p in pairs) else "refuted",
                   effect_text=f"{sum(p[2] for p in pairs)} of {len(pairs)} reruns bit-identical" if pairs else "-")
        return row
    if test.rule == "protected":  # a second job on the run dir: refused, and the first's checkpoint loads
        def safe(c):
            said = any(test.expect in l for l in c.facts.get("second_job", []))
            refused = said and any(l.strip() == "# exit status 2" for l in c.facts.get("second_job", []))
            return refused and c.rc == 0 and c.facts.get("reload_rc") == 0
        started = lambda c: not any("ended before the second" in l for l in c.facts.get("second_job", []))
        pairs = [(s, safe(b), safe(v)) for s, b, v in both if started(b) and started(v)]
        row.update(pairs=pairs, n=len(pairs), effect_text=(
            f"protected in {sum(p[2] for p in pairs)} of {len(pairs)} runs with the switch, {sum(p[1] for p in pairs)} "
            f"of {len(pairs)} without it") if pairs else "-")
        row["verdict"] = ("no data" if not pairs else "not exercised" if all(p[1] and p[2] for p in pairs) else
                          "confirmed" if all(p[2] and not p[1] for p in pairs) else "refuted")
        if row["verdict"] == "not exercised":
            row["effect_text"] += ": both protected, so the switch is not what protects"
        return row
    if test.rule == "caught":
        pairs = []
        for s, b, v in both:
            said = any(test.expect in line for line in v.facts.get("console_tail", []))
            caught = v.rc not in (0, None, "timeout") and said
            pairs.append((s, "ran on" if b.rc == 0 else "hung" if b.rc == "timeout" else f"exit {b.rc}", caught))
        ok = all(p[2] and p[1] in test.baseline_outcomes for p in pairs)
        row.update(pairs=pairs, n=len(pairs), verdict="no data" if not pairs else "confirmed" if ok else "refuted",
                   effect_text=(f"caught in {sum(p[2] for p in pairs)} of {len(pairs)} runs with the switch; without "
                                f"it: " + ", ".join(sorted({p[1] for p in pairs}))) if pairs else "-")
        if pairs and all(p[1] not in test.baseline_outcomes and p[2] for p in pairs):
            row["verdict"] = "not exercised"  # the baseline caught it too: the switch is not what catches it
            row["effect_text"] += f" (the baseline ended as well: not the switch's doing)"
        return row
    pairs, acted = [], []
    for s, b, v in both:
        x = (METRICS[test.metric](b), METRICS[test.metric](v))
        acted.append(loss_curve(b) != loss_curve(v))
        if None not in x:
            pairs.append((s,) + x)
    row["pairs"], row["n"] = pairs, len(pairs)
    if test.acts == "curve" and both and not any(acted):
        row["verdict"] = "not exercised"
        row["effect_text"] = f"every one of the {len(both)} pairs trained the same bits: the switch never acted"
        return row
    if len(pairs) < 2:
        row["verdict"], row["effect_text"] = "no data", f"{len(pairs)} pair(s) (expected at least 2)"
        return row
    if all(p[1] == p[2] for p in pairs):
        row["verdict"] = "metric cannot show it" if any(acted) else "not exercised"
        row["effect_text"] = f"{test.metric} {fmt_value(pairs[0][1], test.metric)} in every pair, equal bit for bit"
        return row
    size = test.size
    if size == "compute":
        margin = compute_margin(cases, test.baseline, seeds)
        if margin is None or margin <= 0:
            row["verdict"], row["effect_text"] = "no data", "no compute-terms margin (the baseline's val loss did " \
                                                             "not fall over its last 10% of steps)"
            return row
        size = test.sign * margin
        row["source"] += f" ({margin * 100:.3g}% of its val loss)"
    row["size"] = size
    base, var = [p[1] for p in pairs], [p[2] for p in pairs]
    effect = vs.paired(base, var, test.scale)
    null = vs.to_scale(size, test.scale)
    row["effect"] = effect
    row["interval"] = vs.interval(effect)
    row["p"] = vs.hypotheses(effect, test.rule, null)
    row["baseline_mean"], row["variant_mean"] = statistics.fmean(base), statistics.fmean(var)
    return row


def adjust(rows, looks_of):
    """The family adjustment (tools/lab/verdict_stats.py): Holm over the primary rows' hypotheses, Benjamini-
    Hochberg over the exploratory ones; a row seen on a second look pays for it (p x looks). Sets each
    statistical row's adjusted p-values and verdict."""
    for primary in (True, False):
        family = [r for r in rows if "p" in r and r["primary"] == primary]
        raw = [min(1.0, p * looks_of(r)) for r in family for p in r["p"]]
        adj = (vs.holm if primary else vs.bh)(raw)
        for i, r in enumerate(family):
            r["p_adjusted"] = (adj[2 * i], adj[2 * i + 1])
            r["family"] = f"{'Holm' if primary else 'BH'} over {len(raw)} hypotheses"
            r["looks"] = looks_of(r)
            r["verdict"] = vs.decide(r["rule"], *r["p_adjusted"])
            # the pairs that would decide it at the family's strictest level (Bonferroni: conservative)
            r["n_needed"] = (vs.n_needed(r["effect"], vs.to_scale(r["size"], r["scale"]), tests=len(raw))
                             if r["verdict"] == "inconclusive" else None)
    for r in rows:
        r["effect_text"] = r.get("effect_text") or effect_text(r)
    return rows


def effect_text(r):
    """The effect in words: the exact value of a deterministic metric, else the mean with its 95% interval."""
    if "effect" not in r:
        return "-"
    e = r["effect"]
    pct = r["scale"] != "difference"
    show = lambda x: f"{vs.from_scale(x, r['scale']) * 100:+.3g}%" if pct else f"{x:+.3g}"
    if e["exact"]:
        return f"{show(e['mean'])} exactly, on every seed"
    lo, hi = r["interval"]
    return f"{show(e['mean'])} [{show(lo)}, {show(hi)}]"
