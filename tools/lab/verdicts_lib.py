# tools/lab/verdicts_lib.py: the claims behind tools/lab/verdicts, and how they run (issue 15/18).
#
# Each piece of folklore is a Claim: the ablations (tools/lab/ablate, or
# tools/lab/netsim for the network's share) that create its conditions, and the
# Tests that pair their cases by seed. Exactly one Test per claim is primary:
# the 14 primaries form one family (Holm); every other row is exploratory
# (Benjamini-Hochberg). Each size or margin names its source: the seed's own
# words, or the one stated default (DEFAULT_SOURCE). The rule is fixed here,
# before any run; tools/lab/verdicts_judge.py applies it, tools/lab/verdicts_report.py
# writes it down. Nothing here runs a rank itself: every case is a
# tools/lab/ablate case, resumed with --resume, so a rerun skips what finished.
#
# Runs with /usr/bin/python3 (scipy for the statistics, matplotlib for the plots).

import dataclasses
import os
import shlex
import statistics
import subprocess
import sys

LAB = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(LAB))
sys.path.insert(0, LAB)
import ablate_lib  # noqa: E402
import verdicts_judge as vj  # noqa: E402

DECK = os.path.join(ROOT, "input", "verdicts.deck")
SWARM_DECK = os.path.join(ROOT, "input", "verdicts-swarm.deck")
CKPT_DECK = os.path.join(ROOT, "input", "verdicts-ckpt.deck")
DATA = os.path.join(ROOT, "data", "bpe2k")
# A corpus of ~224k training tokens (the first 600 kB of fortunes, the same tokenizer): an epoch is ~110
# steps at 4 ranks, so that the claims about epochs see several (A2, A3).
EPOCH_DATA = os.path.join(ROOT, "data", "bpe2k-epochs")
DEFAULT = 0.10
DEFAULT_SOURCE = "default: 10%"
COMPUTE_SOURCE = "default in compute terms: the baseline with 10% fewer steps"
OPTIMIZER = "optimizer adamw lr {lr} beta1 0.9 beta2 0.95 weight_decay 0.1 clip 1.0"


@dataclasses.dataclass
class Scale:
    """How big the runs are: the full suite, or --quick (CI: every claim's machinery, no verdict worth having)."""
    name: str
    seeds: list
    ranks: int          # the ranks of the training claims
    swarm_ranks: int    # A6
    timing_ranks: int   # claims that time steps: one rank per core
    steps: int          # training claims
    eval_every: int
    epoch_steps: int    # A2, A3: at least 3 epochs of EPOCH_DATA
    long_steps: int     # the second point of A1 and A4: about 8x longer
    long_seeds: list
    tune_seeds: list    # the LR choice of A1, A2, A4, B4 (seeds apart from the verdict's)
    lrs: tuple          # the LR grid of that choice (the deck's 3e-3 in the middle)
    speed_steps: int    # claims that time steps
    ckpt_steps: int     # B5: a checkpoint every ckpt_steps/4
    ckpt_deck: str      # A5's deck, checkpoint every ckpt_every, through tools/lab/slowdisk with these limits
    ckpt_every: int
    slowdisk: str
    fault_timeout: int  # seconds a case with a hung rank may run
    watchdog: int       # B7's watchdog limit on one collective (`timeout S`)
    vars: dict = dataclasses.field(default_factory=dict)  # -var NAME VALUE for every case (quick: fewer eval batches)


FULL = Scale("full", [1, 2, 3, 4, 5], 4, 8, 2, 240, 24, 360, 1920, [1, 2, 3], [101, 102], (1.5e-3, 3e-3, 6e-3),
             60, 40, CKPT_DECK, 10, "--write-mbps 100 --read-mbps 200", 90, 10)
QUICK = Scale("quick", [1, 2], 2, 4, 2, 16, 4, 16, 0, [1, 2], [101], (3e-3,), 8, 8, DECK, 4,
              "--write-mbps 40 --read-mbps 80 --size-gb 1", 15, 3, {"eval_batches": 2})


@dataclasses.dataclass
class Experiment:
    """One tools/lab/ablate invocation: its variants (the first is the baseline) and options."""
    name: str
    variants: list            # ['NAME: line; line', ...]
    steps: int
    ranks: int
    common: list = dataclasses.field(default_factory=list)
    eval_every: int = 0       # 0: the last step only
    netsim: str = ""          # tools/lab/netsim's options ('--rate 1gbit', '--nodes 2 --rate 1gbit'): the ablation runs under it
    slowdisk: str = ""        # limits: the ablation runs under tools/lab/slowdisk LIMITS (checkpoints on slow storage)
    reload: bool = False      # each case restarted with -resume auto (timing the load)
    expect_fail: list = dataclasses.field(default_factory=list)
    any_end: list = dataclasses.field(default_factory=list)
    deck: str = DECK
    launcher: str = ""        # a command prefix before mpirun (tools/lab/run-twice: a second job on the run dir)
    vars: dict = dataclasses.field(default_factory=dict)  # -var NAME VALUE
    order: str = "seed-major"  # abba for timing: the baseline is not always first
    timeout: int = 900
    seeds: list = None        # its own seeds (the long runs), else the claim's
    tune: list = dataclasses.field(default_factory=list)  # arms whose LR is chosen first (experiment NAME-lr)
    lr_like: dict = dataclasses.field(default_factory=dict)  # arm -> the tuned arm whose LR it takes
    lr_from: str = ""         # the experiment whose tuning gives the LRs
    target_from: str = ""     # --target-loss: the worst final val loss of that experiment's cases
    extra: bool = False       # a second point (more steps, another network): left out by --quick

    def argv(self, out, seeds, variants, target=None):
        a = ["--deck", os.path.relpath(self.deck, ROOT), "--ranks", str(self.ranks), "--seeds",
             ",".join(map(str, seeds)), "--out", out, "--resume", "--title", self.name,
             "--eval-every", str(self.eval_every), "--timeout", str(self.timeout)]
        if self.steps:
            a += ["--steps", str(self.steps)]
        if self.order != "seed-major":
            a += ["--order", self.order]
        if self.launcher:
            a += ["--launcher", self.launcher]
        if target is not None:
            a += ["--target-loss", repr(target)]
        for name, value in self.vars.items():
            a += ["--var", name, str(value)]
        for v in variants:
            a += ["--variant", v]
        for c in self.common:
            a += ["--common", c]
        for n in self.expect_fail:
            a += ["--expect-fail", n]
        for n in self.any_end:
            a += ["--any-end", n]
        if self.reload:
            a.append("--reload")
        return a

    def command(self, out, seeds, variants=None, target=None):
        tool = (["tools/lab/netsim"] + self.netsim.split() + ["--"] if self.netsim else
                ["tools/lab/slowdisk"] + self.slowdisk.split() + ["--"] if self.slowdisk else ["tools/lab/ablate"])
        return tool + self.argv(out, seeds, variants or self.variants, target)


@dataclasses.dataclass
class Test:
    """One row: `metric` of variant against baseline (same experiment), paired by seed.

    rule: superiority (size: the claimed signed change), non_inferiority (size: the margin, its sign the worse
    side), identical (every rerun bit-identical), caught (the variant's cases end with `expect` in their last
    lines; the baseline's end as `baseline_outcomes` says: 'ran on' unaware, or 'hung' until the timeout).
    size "compute": the compute-terms margin, signed by `sign`. scale: difference, relative, log (times).
    acts "curve": the switch acts through the numerics, so identical loss curves mean it never acted."""
    row: str
    experiment: str
    baseline: str
    variant: str
    metric: str
    rule: str
    size: object = 0.0
    source: str = DEFAULT_SOURCE
    scale: str = "relative"
    primary: bool = False
    acts: str = ""
    sign: int = 1
    expect: str = ""
    baseline_outcomes: tuple = ("ran on",)


@dataclasses.dataclass
class Claim:
    id: str
    folklore: str
    switch: str
    metric: str
    experiments: list
    tests: list
    note: str = ""
    untestable: str = ""  # why this machine cannot create the claim's condition: no runs, "not testable here"
    project: str = ""     # an experiment whose bytes tools/lab/netsim --project takes to 8, 64 and 512 ranks


def loss_ni(row, exp, base, var, primary=False):
    """'keeps convergence' / 'little accuracy loss': val loss no worse than the compute-terms margin."""
    return Test(row, exp, base, var, "val_loss", "non_inferiority", "compute", COMPUTE_SOURCE, primary=primary,
                acts="curve", sign=+1)


def loss_better(row, exp, base, var, primary=False):
    """'helps': val loss lower by at least what 10% more steps would give."""
    return Test(row, exp, base, var, "val_loss", "superiority", "compute", COMPUTE_SOURCE, primary=primary,
                acts="curve", sign=-1)


def overhead(row, exp, base, var, metric="ms_per_step", primary=False):
    """A check that should cost little: no more than DEFAULT slower (log ratio)."""
    return Test(row, exp, base, var, metric, "non_inferiority", DEFAULT, DEFAULT_SOURCE, scale="log",
                primary=primary)


# ---------------------------------------------------------------------------
# the claims


def data_line(data="${data}", shards="train_*.bin", **kw):
    """The deck's data line with keywords set (variants replace the whole line)."""
    words = {"batch": 8, "workers": 2}
    words.update(kw)
    return (f"data shard '{data}/{shards}' valid {data}/val.bin tokenizer {data}/tokenizer.model "
            + " ".join(f"{k} {v}" for k, v in words.items()))


def claims(s):
    """The 14 claims at scale `s` (--quick leaves out the long runs and the second network, and their rows)."""
    every = all_claims(s)
    for c in every:
        for e in c.experiments:
            e.vars = {**s.vars, **e.vars}
        if not s.long_steps:
            c.experiments = [e for e in c.experiments if not e.extra]
        names = {e.name for e in c.experiments}
        c.tests = [t for t in c.tests if t.experiment in names or c.untestable]
    return every


def all_claims(s):
    T, E = Test, Experiment
    steps, R, ev = s.steps, s.ranks, s.eval_every
    epoch_data = os.path.relpath(EPOCH_DATA, ROOT)
    epoch_ev = max(1, s.epoch_steps // 10)
    epoch = 223849 // (R * 8 * 64)  # steps per epoch of EPOCH_DATA
    local = "sync local 8"  # decoupled training: ranks drift for 8 steps between averages
    iid, non_iid = data_line(epoch_data, "train_0000.bin"), data_line(epoch_data, "train_0000.bin", partition="contiguous")
    warm = min(20, s.epoch_steps // 8)
    swarm_vars = {"early": steps // 5, "middle": steps - 2 * (steps // 5), "late": steps // 5,
                  "clusters": s.swarm_ranks // 2, "redraw": max(1, steps // 30)}
    sgdr = f"schedule sgdr period {max(2, epoch)} min_lr 3e-4 warmup {warm}"
    cosine = f"schedule cosine warmup {warm} min_lr 3e-4"
    DGC = "compress topk {r} quant int8 momentum 0.9 warmup {w} exchange partitioned"
    w = max(2, steps // 10)
    dense_vs_dgc = ["dense: compress off", "dgc0.01: " + DGC.format(r=0.01, w=w)]
    return [
        Claim("A1", "3 local steps : 1 sync keeps convergence and cuts communication ~15%", "`sync local 3`",
              "val loss at equal steps (each arm at its own best LR); bytes on the wire; time to a target loss on a "
              "slow network at two bandwidths; the same at 8x the steps",
              [E("A1", ["dense: sync dense", "local3: sync local 3"], steps, R, eval_every=ev,
                 tune=["dense", "local3"]),
               E("A1-long", ["dense: sync dense", "local3: sync local 3"], s.long_steps, R,
                 eval_every=s.long_steps // 10, seeds=s.long_seeds, lr_from="A1", extra=True),
               E("A1-1gbit", ["dense: sync dense", "local3: sync local 3"], steps, R, eval_every=max(1, ev // 3),
                 netsim="--rate 1gbit", lr_from="A1", target_from="A1"),
               E("A1-300mbit", ["dense: sync dense", "local3: sync local 3"], steps, R, eval_every=max(1, ev // 3),
                 netsim="--rate 300mbit", lr_from="A1", target_from="A1", extra=True)],
              [loss_ni("A1", "A1", "dense", "local3", primary=True),
               T("A1.2", "A1", "dense", "local3", "wire_bytes", "superiority", -0.15, "the seed: ~15%"),
               loss_ni("A1.3", "A1-long", "dense", "local3"),
               T("A1.4", "A1-1gbit", "dense", "local3", "target_s", "superiority", -DEFAULT, scale="log"),
               T("A1.5", "A1-300mbit", "dense", "local3", "target_s", "superiority", -DEFAULT, scale="log")],
              "Time to target: each case's training seconds until its val loss first reached the worst final val "
              "loss of any A1 case (so every case reaches it), evaluated every few steps, under tools/lab/netsim."),
        Claim("A2", "LR restarts every 10 epochs, ±5% jitter, restart point chosen from the LR history, help "
              "when nodes' data differ",
              f"`{sgdr} jitter 0.05 restart_from best` under `{local}`, each rank its own slice "
              "(`partition contiguous`) or all ranks the same shuffle",
              "val loss, 2x2: {IID, non-IID by rank} x {cosine, restarts}",
              [E("A2", [f"cosine-noniid: {non_iid}; {cosine}",
                        f"sgdr-noniid: {non_iid}; {sgdr} jitter 0.05 restart_from best",
                        f"cosine-iid: {iid}; {cosine}", f"sgdr-iid: {iid}; {sgdr} jitter 0.05 restart_from best",
                        f"sgdr-nojitter-noniid: {non_iid}; {sgdr} restart_from best"],
                 s.epoch_steps, R, common=[local], eval_every=epoch_ev,
                 tune=["cosine-noniid", "sgdr-noniid", "cosine-iid", "sgdr-iid"],
                 lr_like={"sgdr-nojitter-noniid": "sgdr-noniid"}),
               E("A2-overshoot",
                 [f"last: {non_iid}; {OPTIMIZER.format(lr=1.2e-2)}; schedule sgdr period {max(2, epoch)} min_lr 6e-3 "
                  f"warmup {warm} jitter 0.05 restart_from last",
                  f"best: {non_iid}; {OPTIMIZER.format(lr=1.2e-2)}; schedule sgdr period {max(2, epoch)} min_lr 6e-3 "
                  f"warmup {warm} jitter 0.05 restart_from best"],
                 s.epoch_steps, R, common=[local], eval_every=max(1, epoch_ev // 2), extra=True)],
              [loss_better("A2", "A2", "cosine-noniid", "sgdr-noniid", primary=True),
               loss_better("A2.2", "A2", "cosine-iid", "sgdr-iid"),
               loss_better("A2.3", "A2", "sgdr-nojitter-noniid", "sgdr-noniid"),
               loss_better("A2.4", "A2-overshoot", "last", "best")],
              f"'Every 10 epochs' is scaled to the run: a restart every epoch ({max(2, epoch)} steps of "
              f"{epoch_data}, ~224k tokens), {s.epoch_steps} steps in all, so about "
              f"{s.epoch_steps / max(1, epoch):.1f} epochs with their reshuffles and restarts. A2.4 forces the "
              "overshoot that restart-from-best needs to act: a high, barely decaying LR (peak 1.2e-2, floor 6e-3) "
              "and evals every half-cycle's tenth."),
        Claim("A3", "chaos seeding (per-node seed, reshuffle each epoch, 10% common data on all nodes): ~2% accuracy",
              f"`data ... shuffle chaos common 0.1` under `{local}`", "val next-token accuracy (points); bits per "
              "byte; 2x2: {IID, non-IID by rank} x {fixed, chaos}",
              [E("A3", [f"fixed-noniid: {non_iid} shuffle fixed",
                        f"chaos-noniid: {non_iid} shuffle chaos common 0.1 common_rate 0.1",
                        f"fixed-iid: {iid} shuffle fixed",
                        f"chaos-iid: {iid} shuffle chaos common 0.1 common_rate 0.1"],
                 s.epoch_steps, R, common=[local], eval_every=epoch_ev)],
              [T("A3", "A3", "fixed-noniid", "chaos-noniid", "val_acc", "superiority", +0.02, "the seed: ~2% accuracy",
                 scale="difference", primary=True, acts="curve"),
               T("A3.2", "A3", "fixed-iid", "chaos-iid", "val_acc", "superiority", +0.02, "the seed: ~2% accuracy",
                 scale="difference", acts="curve"),
               T("A3.3", "A3", "fixed-noniid", "chaos-noniid", "val_bpb", "superiority", "compute", COMPUTE_SOURCE,
                 acts="curve", sign=-1)],
              f"The same corpus, decoupled ranks and epochs as A2: {s.epoch_steps} steps."),
        Claim("A4", "top-k% of gradients plus quantisation: up to 70% less traffic, little accuracy loss",
              "Deep Gradient Compression's recipe: `compress topk R quant int8 momentum 0.9 warmup W exchange "
              "partitioned` (error feedback, momentum correction, warm-up); and top-k of the AdamW update "
              "(`target update`)", "val loss against bytes on the wire, over ratios, with int8-only, bf16-only and dense "
              "baselines; the same at 8x the steps",
              [E("A4", dense_vs_dgc + ["dgc0.1: " + DGC.format(r=0.1, w=w), "dgc0.001: " + DGC.format(r=0.001, w=w),
                                       "int8: compress topk 1 quant int8 exchange partitioned",
                                       "bf16: compress topk 1 quant bf16 exchange partitioned",
                                       "topk0.01: compress topk 0.01 quant int8 exchange partitioned",
                                       f"update0.01: compress topk 0.01 quant int8 warmup {w} target update exchange "
                                       "partitioned"],
                 steps, R, eval_every=ev, tune=["dense", "dgc0.01"],
                 lr_like={"dgc0.1": "dgc0.01", "dgc0.001": "dgc0.01", "int8": "dense", "bf16": "dense",
                          "update0.01": "dgc0.01",
                          "topk0.01": "dgc0.01"}),
               E("A4-long", ["dense: compress off", "dgc0.01: " + DGC.format(r=0.01, w=s.long_steps // 10)],
                 s.long_steps, R, eval_every=s.long_steps // 10, seeds=s.long_seeds, lr_from="A4", extra=True)],
              [loss_ni("A4", "A4", "dense", "dgc0.01", primary=True),
               T("A4.2", "A4", "dense", "dgc0.01", "wire_bytes", "superiority", -0.70, "the seed: up to 70%"),
               loss_ni("A4.3", "A4", "dense", "dgc0.1"),
               loss_ni("A4.4", "A4", "dense", "dgc0.001"),
               loss_ni("A4.5", "A4", "dense", "int8"),
               loss_ni("A4.9", "A4", "dense", "bf16"),
               loss_ni("A4.6", "A4", "dense", "update0.01"),
               T("A4.8", "A4", "dense", "topk0.01", "wire_bytes", "superiority", -0.98,
                 "goal: below 1/50 of dense (issue 15/18)"),
               loss_ni("A4.7", "A4-long", "dense", "dgc0.01")],
              "The exchange is the partitioned one (a sparse reduce-scatter, then an all-gather of the re-selected "
              "sum): its payload bytes per rank do not grow with the ranks (docs/COMPRESSION.md). Each arm's LR is "
              "its best of three on two seeds apart.", project="A4"),
        Claim("A5", "fused checkpoints (base + per-node diffs) cut checkpoint time 40%",
              "`checkpoint mode diff codec lossless` against `mode full` (collective) and `mode full writer rank0`",
              "the training's stall per checkpoint (log ratio); write time; restore time; bytes",
              [E("A5", [f"full: checkpoint every {s.ckpt_every} at_end no mode full",
                        f"diff: checkpoint every {s.ckpt_every} at_end no mode diff codec lossless",
                        f"rank0: checkpoint every {s.ckpt_every} at_end no mode full writer rank0"],
                 2 * s.ckpt_every, R, deck=s.ckpt_deck, reload=True, order="abba", slowdisk=s.slowdisk,
                 timeout=900)],
              [T("A5", "A5", "full", "diff", "ckpt_stall_s", "superiority", -0.40, "the seed: 40%", scale="log",
                 primary=True),
               T("A5.2", "A5", "full", "diff", "ckpt_write_s", "superiority", -0.40, "the seed: 40%", scale="log"),
               T("A5.3", "A5", "full", "diff", "ckpt_load_s", "superiority", -0.40, "the seed: 40%", scale="log"),
               T("A5.4", "A5", "full", "diff", "ckpt_bytes", "superiority", -0.40, "the seed: 40%"),
               T("A5.5", "A5", "rank0", "diff", "ckpt_stall_s", "superiority", -0.40, "the seed: 40%", scale="log")],
              f"{os.path.basename(s.ckpt_deck)} (input/verdicts.deck's architecture at 18.3M parameters: a full "
              "checkpoint of 1.1 GB at 4 ranks) under `sync local 4`, so that every rank's own state differs from the "
              "base between syncs; a checkpoint every "
              f"{s.ckpt_every} steps, {2 * s.ckpt_every} in all, written to storage throttled to be bandwidth-bound "
              f"(`tools/lab/slowdisk {s.slowdisk}`: a loop-device file system under a blkio cgroup; "
              "docs/CHECKPOINT.md). The stall is what the training thread waits per checkpoint."),
        Claim("A6", "swarm topology: full → random clusters of 4 → full",
              "input/verdicts-swarm.deck: `topology full`, `topology clusters C redraw D`, `topology full` (phases of "
              "1/5, 3/5, 1/5 of the steps; clusters of C = half the ranks) against `topology full` throughout",
              "val loss; bytes on the wire",
              [E("A6", ["full: topology full", "swarm:"], 0, s.swarm_ranks, eval_every=ev, deck=SWARM_DECK,
                 vars=swarm_vars),
               E("A6-nodes", ["full: topology full", "swarm:"], 0, s.swarm_ranks, deck=SWARM_DECK, vars=swarm_vars,
                 netsim="--nodes 2 --rate 1gbit", order="abba", extra=True)],
              [loss_ni("A6", "A6", "full", "swarm", primary=True),
               T("A6.2", "A6", "full", "swarm", "wire_bytes", "superiority", -DEFAULT),
               T("A6.3", "A6-nodes", "full", "swarm", "train_s", "superiority", -DEFAULT, scale="log")],
              "Wire bytes: a ring all-reduce over g ranks puts 2(g-1)/g of its buffer on the wire, so a cluster of "
              "4 sends 0.857x what 8 ranks do, and leaving the clusters adds one global average. A6.3 times the "
              "training on a simulated two-level network (tools/lab/netsim --nodes 2: two 'nodes' of 4 ranks, each "
              "behind a 1 Gbit/s link; ranks of one node talk through its own loopback), where a random cluster "
              "usually spans both nodes."),
        Claim("A7", "multi-view loss aggregation stops mid-training oscillation",
              "`lossagg robust` (a rank's loss far from the others' median is trimmed)",
              "oscillation of the validation loss (fixed batches, every few steps: no minibatch noise, no trimmed "
              "rank); val loss; clean, and one rank fed noise",
              [E("A7-noisy", ["off: lossagg off", "robust: lossagg robust"], steps, R, eval_every=max(1, ev // 6),
                 common=[data_line(noise_rank=R - 1)]),
               E("A7", ["off: lossagg off", "robust: lossagg robust"], steps, R, eval_every=max(1, ev // 6))],
              [T("A7", "A7-noisy", "off", "robust", "val_oscillation", "superiority", -DEFAULT, primary=True,
                 acts="curve"),
               T("A7.2", "A7", "off", "robust", "val_oscillation", "superiority", -DEFAULT, acts="curve"),
               loss_better("A7.3", "A7-noisy", "off", "robust"),
               loss_ni("A7.4", "A7", "off", "robust")],
              "'Stops' names no size: the default applies."),
        Claim("B1", "check every parameter has a gradient before the sync", "`grad_check missing error`",
              "a detached parameter caught; ms per step (log ratio, ABBA order, one rank per core)",
              [E("B1-detach", ["off: grad_check missing off; fault detach rank 1 step 3",
                               "error: grad_check missing error; fault detach rank 1 step 3"],
                 s.speed_steps, s.timing_ranks, expect_fail=["error"]),
               E("B1", ["off: grad_check missing off", "error: grad_check missing error"], s.speed_steps,
                 s.timing_ranks, order="abba")],
              [T("B1", "B1-detach", "off", "error", "detached", "caught", expect="no gradient reached", primary=True),
               overhead("B1.2", "B1", "off", "error")]),
        Claim("B2", "seed = base + rank, deterministic algorithms", "one `seed`; `shuffle independent` for a "
              "per-rank data stream", "reruns bit-identical; val loss with per-rank streams",
              [E("B2", ["run:", "rerun:", f"per-rank: {data_line(shuffle='independent')}"], steps, R, eval_every=ev)],
              [T("B2", "B2", "run", "rerun", "loss_curve", "identical", primary=True),
               loss_ni("B2.2", "B2", "run", "per-rank")]),
        Claim("B3", "2 loader workers beat 4", "`data ... workers 2` against `workers 4`", "training tokens/s",
              [], [T("B3", "B3", "w4", "w2", "tokens_per_s", "superiority", +DEFAULT, scale="log", primary=True)],
              untestable="the folklore is about Python-bound loader processes competing with the trainer for cores "
                         "(PyTorch's DataLoader); xuanxue's loader is two C++ threads per rank that read mapped "
                         "shards, and this machine has 2 cores for all ranks, so the contention the claim is about "
                         "cannot arise here"),
        Claim("B4", "clip only after unscaling", "fp16 with `clip_order scaled` (the wrong order) against `unscaled`",
              "val loss (each arm at its own best LR)",
              [E("B4", ["unscaled: precision fp16 products widened clip_order unscaled",
                        "scaled: precision fp16 products widened clip_order scaled"], steps, R, eval_every=ev,
                 tune=["unscaled", "scaled"])],
              [T("B4", "B4", "unscaled", "scaled", "val_loss", "superiority", "compute", COMPUTE_SOURCE,
                 primary=True, acts="curve", sign=+1)]),
        Claim("B5", "only rank 0 saves, all ranks load", "`checkpoint ... writer rank0` against `writer collective`",
              "save time, load time (log ratios, ABBA order, one rank per core)",
              [E("B5", [f"collective: checkpoint every {s.ckpt_steps // 4} writer collective",
                        f"rank0: checkpoint every {s.ckpt_steps // 4} writer rank0"], s.ckpt_steps, s.timing_ranks,
                 common=["sync local 4"], reload=True, order="abba"),
               E("B5-twice", [f"collective: checkpoint every {s.ckpt_steps // 4} writer collective",
                              f"rank0: checkpoint every {s.ckpt_steps // 4} writer rank0"], 4 * s.ckpt_steps,
                 s.timing_ranks, common=["sync local 4"], reload=True, launcher="tools/lab/run-twice")],
              [overhead("B5", "B5", "collective", "rank0", "ckpt_write_s", primary=True),
               overhead("B5.2", "B5", "collective", "rank0", "ckpt_load_s"),
               T("B5.3", "B5-twice", "collective", "rank0", "second_job", "protected",
                 expect="in use by another job")],
              "B5.3 is the hazard the folklore guards against: a second job started on the same run directory "
              "while the first writes its checkpoints (tools/lab/run-twice). Protected: the second is refused (exit 2, "
              "naming the first) and the first's checkpoint loads."),
        Claim("B6", "per-rank logs, rank-0 metrics, a barrier after logging", "`output ... barrier on`",
              "ms per step (log ratio, ABBA order, one rank per core)",
              [E("B6", ["off: variable barrier off", "on: variable barrier on"], s.speed_steps, s.timing_ranks,
                 order="abba")],
              [overhead("B6", "B6", "off", "on", primary=True)]),
        Claim("B7", "signal handlers, periodic health all-reduce, tell the others on error",
              f"`health every 1` with the watchdog (`timeout {s.watchdog}`) against neither", "a hung rank: the job ends naming "
              "it, or hangs; a NaN; ms per step (log ratio, ABBA order, one rank per core)",
              [E("B7-hang", ["off: health every 0; timeout 0; fault hang rank 1 step 3",
                             f"on: health every 1; timeout {s.watchdog}; fault hang rank 1 step 3"], s.speed_steps, s.timing_ranks,
                 any_end=["off", "on"], timeout=s.fault_timeout),
               E("B7-nan", ["off: health every 0; timeout 0; fault nan rank 1 step 3",
                            f"on: health every 1; timeout {s.watchdog}; fault nan rank 1 step 3"], s.speed_steps, s.timing_ranks,
                 any_end=["off", "on"], timeout=s.fault_timeout),
               E("B7", ["off: health every 0; timeout 0", f"on: health every 1; timeout {s.watchdog}"], s.speed_steps,
                 s.timing_ranks, order="abba")],
              [T("B7", "B7-hang", "off", "on", "hang", "caught", expect="rank 1: watchdog", baseline_outcomes=("hung",),
                 primary=True),
               T("B7.2", "B7-nan", "off", "on", "nan", "caught", expect="NaN", baseline_outcomes=("ran on",)),
               overhead("B7.3", "B7", "off", "on")],
              f"A case whose job does not end by itself is stopped after {s.fault_timeout} s: that is 'hung'. "
              "SIGKILL (the old B7.2) is left out: no handler can catch it, and mpirun ends the job alike in both arms."),
    ]


# ---------------------------------------------------------------------------
# running


def ensure_data():
    """The BPE corpora of the verdicts (data/bpe2k, data/bpe2k-epochs), made from fortunes when missing."""
    fortunes = os.path.join(ROOT, "data", "fortunes.txt")
    steps = []
    if not os.path.isfile(os.path.join(DATA, "val.bin")):
        steps += [["tools/prepare-data"], ["tools/prepare-data", "--tokenizer", "bpe", "--vocab", "2048", "--out",
                                           DATA, fortunes]]
    if not os.path.isfile(os.path.join(EPOCH_DATA, "val.bin")):
        head = os.path.join(ROOT, "data", "fortunes-head.txt")
        steps += [("head", head), ["tools/prepare-data", "--tokenizer", "bpe", "--vocab", "2048", "--model",
                                   os.path.join(DATA, "tokenizer.model"), "--out", EPOCH_DATA, head]]
    for cmd in steps:
        if cmd[0] == "head":  # the first 600 kB of fortunes, cut after a whole fortune
            with open(fortunes, "rb") as f:
                text = f.read(600000)
            with open(cmd[1], "wb") as f:
                f.write(text[:text.rfind(b"\n%\n") + 3])
            continue
        print(f"# verdicts: {shlex.join(cmd)}", flush=True)
        subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)


def with_lr(variant, lr):
    name, _, lines = variant.partition(":")
    return f"{name}:{lines}" + ("; " if lines.strip() else " ") + OPTIMIZER.format(lr=lr)


def tune_variants(exp, lrs):
    """The tuning ablation's variants: each tuned arm at each LR of the grid ('ARM-lrX')."""
    return [with_lr(v.replace(":", f"-lr{lr:g}:", 1), lr) for v in exp.variants if v.split(":", 1)[0] in exp.tune
            for lr in lrs]


def chosen_lrs(out, exp, lrs):
    """Each tuned arm's LR: the lowest mean final val loss of its tuning cases (None until all have run)."""
    cases = vj.read_experiment(os.path.join(out, f"{exp.name}-lr"))
    chosen = {}
    for arm in exp.tune:
        scores = {}
        for lr in lrs:
            vals = [vj.last_eval(c, "val_loss") for (name, _), c in cases.items()
                    if name == f"{arm}-lr{lr:g}" and c.rc == 0]
            vals = [x for x in vals if x is not None]
            if vals:
                scores[lr] = statistics.fmean(vals)
        chosen[arm] = min(scores, key=scores.get) if len(scores) == len(lrs) else None
    return chosen


def resolved_variants(exp, out, lrs, by_name):
    """The experiment's variants, each arm at its tuned LR (or the LR of the arm it is like; the deck's where
    neither), or None while the tuning has not finished."""
    source = exp if exp.tune else by_name.get(exp.lr_from)
    if source is None:
        return exp.variants
    chosen = chosen_lrs(out, source, lrs)
    out_v = []
    for v in exp.variants:
        arm = v.split(":", 1)[0]
        key = arm if arm in chosen else source.lr_like.get(arm) or exp.lr_like.get(arm)
        if key is None:
            out_v.append(v)
        elif chosen.get(key) is None:
            return None
        else:
            out_v.append(with_lr(v, chosen[key]))
    return out_v


def target_loss(exp, out):
    """The worst final val loss of any case of exp.target_from: every case of the same arms reaches it."""
    cases = vj.read_experiment(os.path.join(out, exp.target_from))
    vals = [vj.last_eval(c, "val_loss") for c in cases.values() if c.rc == 0]
    vals = [x for x in vals if x is not None]
    return max(vals) if vals else None


def run_ablation(cmd, log):
    print(f"# verdicts: {shlex.join(cmd)}", flush=True)
    with open(log, "a") as f:
        f.write(f"\n# {shlex.join(cmd)}\n")
        f.flush()
        p = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)
    with open(log, errors="replace") as f:
        tail = [l for l in f.read().splitlines() if l.startswith("# case ")][-1:]
    print(f"#   exit status {p.returncode}" + (f"; {tail[0][2:]}" if tail else ""), flush=True)
    if p.returncode == 2:  # a usage error: a mixed binary, a bad argument; the harness says which in the log
        with open(log, errors="replace") as f:
            raise SystemExit(f"tools/lab/verdicts: {f.read().strip().splitlines()[-1]}")
    return p.returncode


def commands(exp, out, seeds, scale, by_name):
    """The commands of one experiment in run order: its LR tuning first (when it has one), then itself (None:
    not known until the tuning, or the experiment its target comes from, has run)."""
    cmds = []
    if exp.tune:
        tune = dataclasses.replace(exp, name=f"{exp.name}-lr", variants=tune_variants(exp, scale.lrs), tune=[])
        cmds.append(tune.command(os.path.join(out, tune.name), scale.tune_seeds))
    variants = resolved_variants(exp, out, scale.lrs, by_name)
    target = target_loss(exp, out) if exp.target_from else None
    if variants is None or (exp.target_from and target is None):
        cmds.append(None)
    else:
        cmds.append(exp.command(os.path.join(out, exp.name), exp.seeds or seeds, variants, target))
    return cmds


def run_experiment(exp, out, seeds, scale, log, by_name):
    """One experiment, resumed: its tuning, then itself."""
    if exp.tune:
        run_ablation(commands(exp, out, seeds, scale, by_name)[0], log)
    cmd = commands(exp, out, seeds, scale, by_name)[-1]
    if cmd is None:
        print(f"# verdicts: {exp.name}: skipped (its LR tuning or its target is missing; see {log})", flush=True)
        return
    run_ablation(cmd, log)


def projection(claim, out):
    """tools/lab/netsim --project's table of bytes per rank at 8, 64 and 512 ranks (10 Gbit/s, 5 us) for the
    claim's `project` experiment, or "" where it has not run."""
    path = os.path.join(out, claim.project, ablate_lib.RESULTS) if claim.project else ""
    if not path or not os.path.isfile(path):
        return ""
    p = subprocess.run([sys.executable, os.path.join(LAB, "netsim"), "--project", path, "--ranks", "8,64,512",
                        "--bandwidth", "10gbit"], cwd=ROOT, capture_output=True, text=True)
    text = p.stdout
    return text[text.find("## bytes per rank"):].replace("## bytes per rank per step, projected", "").strip() \
        if p.returncode == 0 and "## bytes per rank" in text else ""


def experiment_names(claim):
    return [e.name for e in claim.experiments] + [f"{e.name}-lr" for e in claim.experiments if e.tune]


def judge_claim(claim, out, seeds, archive=None):
    """The claim's rows before the family adjustment."""
    if claim.untestable:
        return [{"row": t.row, "metric": t.metric, "baseline": t.baseline, "variant": t.variant, "rule": t.rule,
                 "scale": t.scale, "primary": t.primary, "source": t.source, "size": t.size, "pairs": [], "n": 0,
                 "verdict": "not testable here", "effect_text": claim.untestable} for t in claim.tests]
    rows = []
    for t in claim.tests:
        exp = next(e for e in claim.experiments if e.name == t.experiment)
        cases = archive[exp.name] if archive is not None else vj.read_experiment(os.path.join(out, exp.name))
        rows.append(vj.judge(t, cases, exp.seeds or seeds))
    return rows
