"""What the benchmark commands share (tools/bench, tools/lab/compare): the
environment the figures depend on, one xuanxue run through jobs/mpirun.sh and
what it printed, the timed steps of its metrics.jsonl, medians and spreads,
and the nccl-tests style table."""

import os
import re
import statistics
import subprocess
import time

from xxpy import ROOT
import xxpy.metrics

BINARY = os.path.join(ROOT, "build", "xuanxue")
LAUNCH = os.path.join(ROOT, "jobs", "mpirun.sh")
PEAK_BINARY = os.path.join(ROOT, "build", "xx_peak")

# ---------------------------------------------------------------------------
# environment


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def describe_env(env):
    """What the numbers depend on, printed above every table and kept in the JSON."""
    return {
        "OPENBLAS_CORETYPE": env.get("OPENBLAS_CORETYPE", "(unset)"),
        "OPENBLAS_NUM_THREADS": env.get("OPENBLAS_NUM_THREADS", "(unset)"),
        "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", "(unset)"),
        "nproc": os.cpu_count(),
        "cpu": cpu_model(),
        "binary": os.path.relpath(BINARY, ROOT),
    }


def print_env(info):
    print("# environment (tools/env.sh)")
    for k, v in info.items():
        print(f"#   {k:<22} {v}")


# ---------------------------------------------------------------------------
# one xuanxue run and what it printed

# "peak (MFU)  95.3 GFLOP/s per core (SOURCE)" or "peak (MFU)  n/a: WHY"
PEAK_RE = re.compile(r"peak \(MFU\)\s+(?:([0-9.]+) GFLOP/s per core \(([^)]*)\)|n/a: (.*))$", re.M)
PERF_RE = re.compile(r"^PERFORMANCE (.*)$", re.M)
BACKEND_RE = {"kernels": re.compile(r"^\s+kernels\s+(.*)$", re.M),
              "mpi": re.compile(r"^\s+control\s+(.*)$", re.M),
              "gemm": re.compile(r"^\s+gemm\s+(.*)$", re.M),
              "flop_per_token": re.compile(r"^\s+parameters\s+.*, ([0-9.e+]+) FLOP/token$", re.M)}
ATTENTION_RE = re.compile(r"^\s+attention\s+(.*)$", re.M)  # the kernel a run chose, per case
PARAMS_RE = re.compile(r"^\s+parameters\s+(\d+) ", re.M)


class RunFailed(Exception):
    pass


def run_xuanxue(env, ranks, deck, variables, timeout):
    """Runs the binary on `ranks` ranks; returns (stdout+stderr, wall seconds)."""
    cmd = [LAUNCH, str(ranks), deck]
    for name, value in variables.items():
        cmd += ["-var", name, str(value)]
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RunFailed(f"{' '.join(cmd)}: no result after {timeout} s (expected it to finish; raise --timeout?)")
    wall = time.monotonic() - t0
    out = p.stdout + p.stderr
    if p.returncode != 0:
        tail = "\n".join("#   " + l for l in out.strip().splitlines()[-15:])
        raise RunFailed(f"{' '.join(cmd)}: exit status {p.returncode}; last lines:\n{tail}")
    return out, wall


def number_or_none(v):
    """A PERFORMANCE value: a number, or None for n/a (a run without a trustworthy peak has mfu=n/a)."""
    try:
        return float(v)
    except ValueError:
        return None


def parse_perf(out):
    m = PERF_RE.findall(out)
    if not m:
        raise RunFailed("no PERFORMANCE line in the output (expected one at the end of every run)")
    return {k: number_or_none(v) for k, v in (kv.split("=", 1) for kv in m[-1].split())}


def parse_peak(out):
    """(GFLOP/s per core or None, source or why there is none) from the backends table."""
    m = PEAK_RE.search(out)
    if not m:
        raise RunFailed("no 'peak (MFU)' line in the backends table")
    if m.group(1):
        return float(m.group(1)), m.group(2)
    return None, "n/a: " + m.group(3)


def timed_steps(metrics_path):
    """Steps after the first log interval, from metrics.jsonl.

    The first interval holds the warm-up (first touch of every buffer, the
    loader filling its queue) and is dropped. Each later record covers the
    steps since the record before it, at its ms_per_step and tokens_per_s:
      seconds = steps * ms_per_step / 1e3,  tokens = tokens_per_s * seconds
      tokens/s = sum(tokens) / sum(seconds),  MFU = sum(mfu * seconds) / sum(seconds)
    (MFU is tokens/s times a constant, so its time-weighted mean is the MFU of
    the summed tokens/s.) MFU is None when a record has none (no peak, or a
    rate above the peak).
    """
    # log records only: eval-only records have no timing
    records = xxpy.metrics.by_step(r for r in xxpy.metrics.read(metrics_path) if "tokens_per_s" in r)
    if len(records) < 2:
        raise RunFailed(f"{metrics_path}: {len(records)} log record(s); the first is warm-up and is dropped "
                        "(expected --steps larger than the deck's log_every)")
    steps = seconds = tokens = mfu_s = 0.0
    for prev, r in zip(records, records[1:]):
        n = r["step"] - prev["step"]
        s = n * r["ms_per_step"] / 1e3
        steps += n
        seconds += s
        tokens += r["tokens_per_s"] * s
        mfu_s = None if mfu_s is None or r.get("mfu") is None else mfu_s + r["mfu"] * s
    return {"steps": int(steps), "first_timed_step": records[0]["step"] + 1,
            "tokens_per_s": tokens / seconds, "ms_per_step": 1e3 * seconds / steps,
            "mfu": None if mfu_s is None else mfu_s / seconds}


# ---------------------------------------------------------------------------
# statistics and the table


def spread(values):
    """Median and min-max; None when any value is None (an MFU without a peak)."""
    if any(v is None for v in values):
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def fmt_spread(s, fmt):
    if s is None:
        return "n/a", "-"
    return f"{format(s['median'], fmt)}", f"{format(s['min'], fmt)}-{format(s['max'], fmt)}"


def fmt_or_na(v, fmt):
    return "n/a" if v is None else format(v, fmt)


def pct(s):
    """A spread of fractions as percentages (None stays None)."""
    return {k: 100 * v for k, v in s.items()} if s else None


def print_table(columns, rows):
    """columns: (name, unit, width); rows: lists of strings. Right-aligned, nccl-tests style."""
    print("#" + "".join(f" {name:>{w}}" for name, _, w in columns))
    print(("#" + "".join(f" {unit:>{w}}" for _, unit, w in columns)).rstrip())
    for row in rows:
        print(" " + "".join(f" {cell:>{w}}" for cell, (_, _, w) in zip(row, columns)))


def ensure_peak(env):
    """Before train and compare: `tools/bench peak --if-missing`, so the runs have a peak for their MFU."""
    if not os.access(PEAK_BINARY, os.X_OK):
        print(f"# note: {os.path.relpath(PEAK_BINARY, ROOT)} is not built: no peak is measured, runs without "
              "peak_gflops print MFU n/a")
        return
    p = subprocess.run([PEAK_BINARY, "-in", "input/tiny.deck", "--if-missing", "--quiet"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    said = (p.stdout + p.stderr).strip()
    if said:
        print(f"#   {'peak (measured now)':<22} {said}")
    if p.returncode != 0:
        print(f"# note: tools/bench peak failed (exit status {p.returncode}): MFU n/a")
