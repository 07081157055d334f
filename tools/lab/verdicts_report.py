# tools/lab/verdicts_report.py: results.json, VERDICTS.md, the plots and the archive of tools/lab/verdicts
# (issue 15/18). The rule's words live here, beside the table they explain.
import dataclasses
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import verdict_stats as vs  # noqa: E402
import verdicts_judge as vj  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RULE_FILES = ("tools/lab/verdict_stats.py", "tools/lab/verdicts_lib.py", "tools/lab/verdicts_judge.py", "tools/lab/verdicts_report.py")

RULE = f"""\
Fixed before the runs: the claims, their conditions, each row's metric, size and source, and which row is
primary are set in tools/lab/verdicts_lib.py; the tests in tools/lab/verdict_stats.py; the pairing and the
special verdicts in tools/lab/verdicts_judge.py. The commit that last changed them is named above, with the
time of the first case that ran under them.

- **Pairs.** The baseline and the variant run on the same seeds; each seed gives one difference on the
  row's scale: `difference` (points, nats), `relative` (a fraction of the baseline), or `log` (times and
  rates: ln(variant / baseline), reported as the geometric-mean ratio less one). Timing rows run in ABBA
  order (the baseline first on odd seeds, second on even ones); those that time steps (B1, B6, B7) and B5
  run one rank per core.
- **Before any statistics.** *not testable here*: this machine cannot create the claim's condition (the
  reason is given; nothing runs). *not exercised*: every pair trained the same bits (identical loss curves),
  so the switch never acted; for a check that must catch a fault, the baseline ended the same way without
  it. *metric cannot show it*: the switch acted (the curves differ) but the metric is equal in every pair.
  *no data*: fewer than two pairs.
- **Two one-sided tests per row** (paired t): superiority ("changes the metric by S"): *support*
  H0: delta <= 0, *against* H0: delta >= |S|; non-inferiority ("no worse than M"): *support* H0: delta >= |M|,
  *against* H0: delta <= |M| (oriented so that the claim, or the worse side, points to +). A deterministic
  metric (the same difference on every seed, such as bytes) is exact: its p-values are 0 or 1 and it is
  printed as one value, not an interval.
- **Families.** One primary row per claim: Holm over both hypotheses of every primary (family-wise error
  below {vs.ALPHA:g}). Every other row is exploratory: Benjamini-Hochberg over theirs (false discovery rate
  below {vs.ALPHA:g}). A claim whose primary is inconclusive after the first pass runs on more seeds once;
  its rows then pay for the second look: p x 2 before the adjustment (alpha spending, {vs.ALPHA:g}/2 a look).
- **The verdict**, from the adjusted p-values at {vs.ALPHA:g}: superiority: support and against rejected:
  *confirmed, smaller than claimed*; support only: *confirmed*; against only: *refuted*; neither:
  *inconclusive*, with the pairs that would decide it (80% power at the family's strictest level).
  Non-inferiority: support: *confirmed*; against: *refuted*; neither: *inconclusive*. Functional rows:
  *identical* is confirmed when every rerun's loss equals the first run's at every step; *caught* when every
  run with the switch ended naming the fault and every run without it ran on (or hung) as the row states;
  *protected* when, with a second job started on the run directory, the second is refused and the first's
  checkpoint loads with the switch and not without it (both protected: *not exercised*).
- **Sizes.** Each row names its source: the seed's own words (~15%, up to 70%, 40%, ~2% accuracy), the
  project's own goal (A4.8: the compressed exchange below 1/50 of dense), or the one default: 10%. For a loss the default is in compute terms: the margin is how much worse the baseline's
  val loss was with 10% fewer steps (its val loss at 0.9 T against T, as a fraction, averaged over its seeds).
- **LRs.** For A1, A2, A4 and B4 each arm's LR is its best of {{1.5e-3, 3e-3, 6e-3}} by mean final val loss on
  two seeds (101, 102) that the verdict does not use; the verdict's runs then compare best against best."""


def git(*args):
    try:
        return subprocess.run(["git", "-C", ROOT] + list(args), capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def git_commit():
    head = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = git("status", "--porcelain", "--untracked-files=no")
    return head + ("+changes" if dirty else "")


def rule_commit():
    """(the commit that last changed the rule's files with its date, its unix time or None, uncommitted changes)."""
    line = git("log", "-1", "--format=%h %cI %ct", "--", *RULE_FILES).split()
    dirty = bool(git("status", "--porcelain", "--", *RULE_FILES))
    if len(line) != 3:
        return "unknown", None, dirty
    return f"{line[0]} ({line[1]})", int(line[2]), dirty


def machine():
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{cpu}, {len(os.sched_getaffinity(0))} cores, {platform.system()} {platform.release()}"


def provenance_summary(experiments):
    """What ran the cases (tools/lab/ablate's per-case provenance): the distinct binaries with the commits they ran
    at, the corpus and tokenizer files with their sha256, the libraries, the networks, and when."""
    bins, files, libs, nets, ends = {}, {}, {}, set(), []
    for cases in experiments.values():
        for c in cases.values():
            p = c.provenance or {}
            sha = (p.get("binary") or {}).get("sha256")
            if sha:
                bins.setdefault(sha[:12], set()).add(str(p.get("git", "?"))[:12])
            files.update((p.get("data") or {}).get("sha256") or {})
            for k, v in (p.get("libraries") or {}).items():
                libs.setdefault(k, set()).add(str(v))
            net = p.get("network")
            if net:
                nets.add(net if isinstance(net, str) else str(net.get("rate", net)))
            if c.end_unix:
                ends.append(c.end_unix)
    return {"binaries": {k: sorted(v) for k, v in bins.items()},
            "corpus": [f"{os.path.basename(k)} {v[:12]}" for k, v in sorted(files.items())],
            "libraries": {k: sorted(v) for k, v in sorted(libs.items())}, "networks": sorted(nets),
            "first_case_end": min(ends) if ends else None, "last_case_end": max(ends) if ends else None}


def results_doc(cfg, chosen, seeds_of, looks_of, rows_of, experiments):
    rows = [r for c in chosen for r in rows_of[c.id]]
    vj.adjust(rows, lambda r: looks_of[r["claim"]])
    when = lambda t: datetime.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M") if t else "-"
    prov = provenance_summary(experiments)
    rule, rule_time, rule_dirty = rule_commit()
    starts = [c.end_unix - (c.wall_s or 0) for cases in experiments.values() for c in cases.values() if c.end_unix]
    before = (rule_time is not None and not rule_dirty and bool(starts) and rule_time < min(starts))
    doc = {"tool": "tools/lab/verdicts", "command": cfg["command"], "scale": dataclasses.asdict(cfg["scale"]),
           "commit": git_commit(), "machine": machine(),
           "date": f"{datetime.datetime.now():%Y-%m-%d %H:%M}", "provenance": prov,
           "cases_from": when(prov["first_case_end"]), "cases_to": when(prov["last_case_end"]),
           "rule_commit": rule + (" with uncommitted changes" if rule_dirty else ""),
           "rule_before_runs": before, "claims": []}
    for c in chosen:
        doc["claims"].append({"id": c.id, "folklore": c.folklore, "switch": c.switch, "metric": c.metric,
                              "seeds": seeds_of[c.id], "looks": looks_of[c.id], "note": c.note,
                              "untestable": c.untestable, "commands": cfg["commands"][c.id],
                              "projection": cfg["projections"].get(c.id, ""),
                              "variants": {e.name: e.variants for e in c.experiments}, "rows": rows_of[c.id]})
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
the SentencePiece BPE text of fortunes (vocab 2048, 1.0M tokens; A2 and A3 on its first 224k tokens, so
that they see several epochs), on {ranks} ranks ({swarm} for A6, {timing} for the claims that time steps:
one per core), {steps} steps for the training claims ({long} for the second point of A1 and A4, {epoch} for
A2 and A3), {speed} for those that time steps, {ckpt} for the checkpoint claims; seeds {seeds} (more where
stated).

What it can show: whether a switch does what it says on this code (bytes, bits, which run is caught),
what it costs per step here, and effects on the loss of a small model that are larger than seed-to-seed
noise. What it cannot: effects at scale. The model is 10^4 to 10^5 times smaller than the ones the folklore
comes from, its ranks share two cores, so communication is cheap next to compute (A1 meets a slow network
only under tools/lab/netsim, shared by all ranks), and a checkpoint is a few MB written to a page cache rather
than to a parallel file system. A verdict here is a verdict about this scale; "refuted" means refuted here,
at this n, by the stated rule."""


def size_text(r):
    """The size or margin with its source; '-' for functional rows (identical, caught), which have none."""
    s = r["size"]
    if r["rule"] in ("identical", "caught", "protected"):
        return "-"
    if isinstance(s, str) or s is None:
        return f"({r.get('source', '-')})"
    value = f"{s:+.3g}" if r["scale"] == "difference" else f"{s * 100:+.3g}%"
    return f"{value} ({r.get('source', '-')})"


def p_text(r):
    if "p_adjusted" not in r:
        return "-"
    a, b = r["p_adjusted"]
    return f"{a:.2g} / {b:.2g}"


def why(r):
    if "effect" not in r:
        return r.get("effect_text", "") if r["rule"] not in ("identical", "caught", "protected") else ""
    text = (f"{r['metric']} {vj.fmt_value(r['baseline_mean'], r['metric'])} → "
            f"{vj.fmt_value(r['variant_mean'], r['metric'])}")
    if r["verdict"] == "inconclusive":
        n = r.get("n_needed")
        text += f"; about {n} pairs would decide it" if n else "; more pairs than practical would be needed"
    return text + "."


def cell(x):
    return str(x).replace("|", "\\|")


def table(rows_by_claim, claims_by_id, primary):
    lines = ["| id | claim | metric | baseline → variant | size (source) | effect [95% CI] | n | adj. p support / "
             "against | verdict | why |", "|---|---|---|---|---|---|---|---|---|---|"]
    for cid, rows in rows_by_claim:
        for r in rows:
            if r["primary"] != primary:
                continue
            c = claims_by_id[cid]
            lines.append("| " + " | ".join(cell(x) for x in (
                r["row"], c["folklore"] if primary else "〃" if r["row"] != cid else c["folklore"], r["metric"],
                f"`{r['baseline']}` → `{r['variant']}`", size_text(r),
                "-" if r["verdict"] == "not testable here" else r.get("effect_text", "-"), r["n"], p_text(r),
                f"**{r['verdict']}**", why(r))) + " |")
    return lines


def verdicts_md(doc, plots_rel):
    scale = doc["scale"]
    prov = doc["provenance"]
    bins = "; ".join(f"`{sha}` (run at commit {', '.join(commits)})" for sha, commits in prov["binaries"].items())
    lines = ["# Verdicts: the folklore of distributed training, measured", "",
             "Generated by tools/lab/verdicts; never edited by hand. To regenerate it (resumable: a rerun skips the "
             "cases that finished, and refuses cases of another binary):", "", "```", doc["command"], "```", "",
             f"- Report written at commit {doc['commit']}, {doc['date']}, on {doc['machine']}. Scale "
             f"`{scale['name']}`.",
             f"- The cases ran from {doc['cases_from']} to {doc['cases_to']}, on binary {bins or 'not recorded'}.",
             f"- The rule was last changed in commit {doc['rule_commit']}: "
             + ("before the first case ran." if doc["rule_before_runs"] else
                "NOT before every case ran (or not committed): these verdicts were not judged by a rule fixed in "
                "advance."),
             "- Corpus and tokenizer (sha256): " + (", ".join(f"`{x}`" for x in prov["corpus"]) or "not recorded") + ".",
             "- Libraries: " + (", ".join(f"{k} {'/'.join(v)}" for k, v in prov["libraries"].items())
                                or "not recorded") + f". Networks: {', '.join(prov['networks']) or '-'}.",
             "- Every case's figures are archived in [verdicts/archive.json.xz](verdicts/archive.json.xz); "
             "`tools/lab/verdicts --from-archive docs/verdicts/archive.json.xz` rebuilds this report from it.", "",
             "## The 14 primary verdicts (Holm)", ""]
    claims_by_id = {c["id"]: c for c in doc["claims"]}
    rows_by_claim = [(c["id"], c["rows"]) for c in doc["claims"]]
    lines += table(rows_by_claim, claims_by_id, True)
    lines += ["", "## Exploratory rows (Benjamini-Hochberg)", ""]
    lines += table(rows_by_claim, claims_by_id, False)
    lines += ["", "## The rule", "", RULE, "",
              SCALE_TEXT.format(ranks=scale["ranks"], swarm=scale["swarm_ranks"], timing=scale["timing_ranks"],
                                steps=scale["steps"], long=scale["long_steps"], epoch=scale["epoch_steps"],
                                speed=scale["speed_steps"], ckpt=scale["ckpt_steps"],
                                seeds=",".join(map(str, scale["seeds"]))), "", "## Each claim", ""]
    for c in doc["claims"]:
        lines += [f"### {c['id']}: {c['folklore']}", "", f"Switch: {c['switch']}. Metric: {c['metric']}. "
                  f"Seeds: {','.join(map(str, c['seeds']))}" + (f" (a second look: {c['looks']} looks)"
                                                               if c["looks"] > 1 else "") + ".", ""]
        if c["untestable"]:
            lines += [f"**Not testable here**: {c['untestable']}.", ""]
        if c["note"]:
            lines += [c["note"], ""]
        for name, variants in c["variants"].items():
            lines += [f"- ablation `{name}`: " + "; ".join(f"`{v}`" for v in variants)]
        if c["commands"]:
            lines += ["", "```"] + c["commands"] + ["```", ""]
        for r in c["rows"]:
            lines += [f"- {r['row']} ({'primary' if r['primary'] else 'exploratory'}; {r['metric']}, "
                      f"{r['baseline']} → {r['variant']}; by seed: {pairs_text(r)}): **{r['verdict']}**. "
                      f"{r.get('effect_text', '')}; {why(r)}"]
        if c.get("projection"):
            lines += ["", f"Bytes per rank per step projected from these runs to 8, 64 and 512 ranks "
                      f"(`tools/lab/netsim --project`; its formulas are in docs/ABLATE.md):", "", c["projection"]]
        if c["id"] in plots_rel:
            lines += ["", f"![{c['id']}]({plots_rel[c['id']]})"]
        lines.append("")
    return "\n".join(lines) + "\n"


def pairs_text(r):
    if r["rule"] == "identical":
        return ", ".join(f"{p[0]}: {'same' if p[2] else 'differ'}" for p in r["pairs"]) or "-"
    if r["rule"] == "caught":
        return ", ".join(f"{p[0]}: {'caught' if p[2] else 'missed'}, without: {p[1]}" for p in r["pairs"]) or "-"
    if r["rule"] == "protected":
        yes = lambda x: "protected" if x else "not protected"
        return ", ".join(f"{p[0]}: {yes(p[1])} → {yes(p[2])}" for p in r["pairs"]) or "-"
    return ", ".join(f"{p[0]}: {vj.fmt_value(p[1], r['metric'])} → {vj.fmt_value(p[2], r['metric'])}"
                     for p in r["pairs"]) or "-"


def plot_claim(c, experiments, path):
    """The rows' effects with their intervals and sizes; the val loss curves of the claim's first ablation."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in c["rows"] if "effect" in r]
    first = next(iter(c["variants"]), None)
    curves = {}
    for (variant, seed), case in (experiments.get(first) or {}).items():
        vals = [(r["step"], r["val_loss"]) for r in case.records if "val_loss" in r]
        if len(vals) > 1 and seed in c["seeds"]:
            curves.setdefault(variant, []).append(dict(vals))
    # val loss against bytes on the wire, one point per variant (A4's curve over ratios)
    tradeoff = {}
    for (variant, seed), case in (experiments.get(first) or {}).items():
        b, v = vj.wire_bytes(case), vj.last_eval(case, "val_loss")
        if b is not None and v is not None and seed in c["seeds"]:
            tradeoff.setdefault(variant, []).append((b, v))
    tradeoff = tradeoff if len(tradeoff) >= 3 else {}
    panels = bool(rows) + bool(curves) + bool(tradeoff)
    if not panels:
        return False
    fig, axes = plt.subplots(1, panels, figsize=(6 * panels, 3.5), squeeze=False)
    ax, i = axes[0], 0
    if rows:
        a, i = ax[0], 1
        for y, r in enumerate(rows):
            sc = r["scale"]
            f = (lambda x: vs.from_scale(x, sc) * 100) if sc != "difference" else (lambda x: x)
            lo, hi = r["interval"]
            m = f(r["effect"]["mean"])
            a.errorbar([m], [y], xerr=[[m - f(lo)], [f(hi) - m]], fmt="o", color="C0" if r["primary"] else "C7",
                       capsize=4)
            size = r["size"] * (100 if sc != "difference" else 1)
            a.plot([size] * 2, [y - 0.3, y + 0.3], color="C3", lw=2)
        a.axvline(0, color="gray", lw=0.8)
        a.set_yticks(range(len(rows)))
        a.set_yticklabels([f"{r['row']} {r['metric']}" + ("" if r["scale"] == "difference" else " %") for r in rows])
        a.set_xlabel("variant vs baseline (95% CI, unadjusted); red: size or margin")
        a.invert_yaxis()
        a.grid(alpha=0.3)
    if curves:
        a = ax[i]
        for k, (variant, runs) in enumerate(sorted(curves.items())):
            steps = sorted(set.intersection(*(set(r) for r in runs)))
            a.plot(steps, [statistics.fmean(r[s] for r in runs) for s in steps], "o-", ms=2, color=f"C{k}",
                   label=f"{variant} (mean of {len(runs)})")
        a.set_xlabel("step")
        a.set_ylabel("val loss")
        a.legend(fontsize=7)
        a.grid(alpha=0.3)
        i += 1
    if tradeoff:
        a = ax[i]
        for k, (variant, pts) in enumerate(sorted(tradeoff.items())):
            x, y = statistics.fmean(p[0] for p in pts) / 1e6, statistics.fmean(p[1] for p in pts)
            a.scatter([x], [y], color=f"C{k}")
            a.annotate(variant, (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
        a.set_xscale("log")
        a.set_xlabel("MB on the wire per rank, whole run (log)")
        a.set_ylabel("final val loss (mean over seeds)")
        a.grid(alpha=0.3)
    fig.suptitle(f"{c['id']}: {c['folklore'][:90]}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def report(doc, out, docs, experiments, meta):
    """OUT/results.json, OUT/VERDICTS.md, OUT/verdicts/*.png, OUT/archive.json.xz; with docs, the same under
    docs/ (VERDICTS.md, verdicts/*.png, verdicts/archive.json.xz)."""
    write_json(os.path.join(out, "results.json"), doc)
    targets = [(out, "verdicts")] + ([(os.path.join(ROOT, "docs"), "verdicts")] if docs else [])
    for folder, sub in targets:
        os.makedirs(os.path.join(folder, sub), exist_ok=True)
        vj.write_archive(os.path.join(folder, sub, "archive.json.xz"), experiments, meta)
        plots = {}
        for c in doc["claims"]:
            path = os.path.join(folder, sub, f"{c['id']}.png")
            try:
                if plot_claim(c, experiments, path):
                    plots[c["id"]] = f"{sub}/{c['id']}.png"
            except Exception as e:  # a missing matplotlib must not cost the table
                print(f"# verdicts: plot {c['id']} not written: {type(e).__name__}: {e}")
        with open(os.path.join(folder, "VERDICTS.md"), "w") as f:
            f.write(verdicts_md(doc, plots))
    return os.path.join(targets[-1][0], "VERDICTS.md")


def summary_lines(doc):
    return [f"{r['row']:<5} {'P' if r['primary'] else ' '} {r['verdict']:<32} {r['metric']:<18} "
            f"{r.get('effect_text', '-')}" for c in doc["claims"] for r in c["rows"]]
