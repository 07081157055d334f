# tools/lab/ablate_lib.py: the ablation harness behind tools/lab/ablate (and tools/lab/netsim).
#
# An ablation is a base deck, a list of variants (each a few deck lines that
# replace the base's lines of the same command) and a list of seeds. Every
# (variant, seed) is one case: its own deck OUT/<variant>/seed<S>/deck.in, its
# own output dir beside it (metrics.jsonl logged at every step), its own
# console.txt. Cases run one at a time, seed-major (all variants for the first
# seed, then the next seed...), so that the noise of a shared machine falls on
# every variant alike; --order abba reverses the variants on every second seed.
# Each case records its provenance (binary and corpus sha256, commit, library
# versions, network shaping, CPU, load); --resume refuses to mix binaries or
# corpora. docs/ABLATE.md describes the figures; the formulas are in the
# docstrings of case_summary and variant_summary.
#
# Runs with /usr/bin/python3 (numpy and matplotlib for the plots only).

import argparse
import datetime
import glob
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tools/, for xxpy
import xxpy.deck  # noqa: E402
import xxpy.metrics  # noqa: E402
from xxpy import ROOT  # noqa: E402
from xxpy.launch import sourced_env  # noqa: E402
RESULTS = "results.json"
LAST_N = 10  # final train loss: the mean of the last LAST_N logged steps
HARNESS_COMMANDS = {"seed": "--seeds", "output": "the harness (OUT/<variant>/seed<S>, log_every 1)"}


class UsageError(Exception):
    """A bad command line or missing input: one message, exit status 2."""


# ---------------------------------------------------------------------------
# the command line

USAGE_EXAMPLE = """\
example:
  tools/lab/ablate --deck input/deepseek-tiny.deck --ranks 4 --seeds 1,2,3 --steps 200 \\
     --variant 'dense: sync dense' \\
     --variant 'topk-int8: compress topk 0.01 quant int8' \\
     --variant 'local4: sync local 4' --eval-every 20 --target-loss 2.5
  tools/lab/ablate --report-only runs/ablate/NAME     # rebuild table and plots

A variant is 'NAME: deck line; deck line; ...' (NAME: letters, digits, '.', '_',
'-'). Each line replaces every line of the base deck with the same command (its
first word; for 'variable', its first two words), or else goes in just before the
first 'run' line. 'base:' with no lines runs the deck as it is. The first variant
is the baseline of the relative columns. docs/ABLATE.md has the details."""


def parser():
    p = argparse.ArgumentParser(
        prog="tools/lab/ablate", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Runs every variant of a deck for every seed, one case at a time, interleaved "
                    "(seed-major), and reports loss, communication and speed per variant: "
                    "OUT/results.json, OUT/table.md, OUT/loss.png, OUT/val_loss.png, OUT/bytes.png.",
        epilog=USAGE_EXAMPLE)
    p.add_argument("--deck", help="base deck, e.g. input/tiny.deck")
    p.add_argument("--variant", action="append", default=[], metavar="'NAME: LINE; LINE'",
                   help="a variant (repeat the option; the first is the baseline)")
    p.add_argument("--seeds", default="1", help="comma-separated seeds, replacing the deck's 'seed' line (default 1)")
    p.add_argument("--ranks", type=int, default=2, help="MPI ranks per case (default 2)")
    p.add_argument("--steps", type=int, help="sets -var steps N (the decks' 'run ${steps}')")
    p.add_argument("--var", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                   help="-var NAME VALUE for every case (repeatable)")
    p.add_argument("--common", action="append", default=[], metavar="'LINE; LINE'",
                   help="deck lines applied to every case before its variant's lines, e.g. 'checkpoint every 0'")
    p.add_argument("--eval-every", type=int, metavar="E",
                   help="sets 'every E' on the deck's eval lines (or adds 'eval every E')")
    p.add_argument("--target-loss", type=float, metavar="X",
                   help="report the training seconds and the step at which val_loss first reached <= X")
    p.add_argument("--out", help="output folder (default runs/ablate/<title or deck>-<date>); must be new or empty")
    p.add_argument("--title", help="a title for the table and the plots")
    p.add_argument("--bin", default=os.path.join(ROOT, "build", "xuanxue"),
                   help="the xuanxue binary (default build/xuanxue of the repository)")
    p.add_argument("--launcher", action="append", default=[], metavar="'PREFIX'",
                   help="a command prefix put before mpirun, e.g. 'ip netns exec NS' (repeatable; outermost first)")
    p.add_argument("--mpirun-args", action="append", default=[], metavar="'FLAGS'",
                   help="extra mpirun flags (repeatable)")
    p.add_argument("--timeout", type=float, default=3600, help="seconds before a case is stopped (default 3600)")
    p.add_argument("--any-end", action="append", default=[], metavar="NAME",
                   help="variant NAME meets a fault it may not catch: its cases count as run however they end "
                        "(exit 0, a failure, or stopped at --timeout: a hang)")
    p.add_argument("--expect-fail", action="append", default=[], metavar="NAME",
                   help="variant NAME is meant to end in failure (an injected fault): its cases count as run "
                        "when they fail, and their figures are what they logged")
    p.add_argument("--order", choices=ORDERS, default="seed-major",
                   help="seed-major (default): every variant in the given order for each seed; abba: the given "
                        "order for the 1st, 3rd, ... seed and reversed for the 2nd, 4th, ... (A B, B A, A B, ...), "
                        "so that the baseline does not always run first")
    p.add_argument("--resume", action="store_true",
                   help="OUT holds this ablation, partly run: keep its finished cases, run the rest (exit 2 when they "
                        "ran another binary or corpus than now)")
    p.add_argument("--resume-any-binary", action="store_true",
                   help="with --resume: keep finished cases even when they ran another binary or corpus/tokenizer "
                        "(sha256); the mix is recorded in results.json and the table")
    p.add_argument("--netsim-shaping", help=argparse.SUPPRESS)  # tools/lab/netsim: its shaping, as JSON
    p.add_argument("--ckpt-root", metavar="DIR",
                   help="each case's RUN_DIR/ckpt is a symlink to DIR/<variant>/seed<S> (made afresh before the case): "
                        "its checkpoints go to DIR's storage (tools/lab/slowdisk)")
    p.add_argument("--ckpt-root-clean", action="store_true",
                   help="with --ckpt-root: remove a case's checkpoints from DIR once it (and its --reload) has ended; "
                        "its figures stay in console.txt")
    p.add_argument("--slowdisk-storage", help=argparse.SUPPRESS)  # tools/lab/slowdisk: its storage limits, as JSON
    p.add_argument("--reload", action="store_true",
                   help="after each case, start it again with -resume auto (nothing left to train: it reads its "
                        "newest checkpoint and ends); its console goes to console_reload.txt")
    p.add_argument("--report-only", metavar="OUT", help="rebuild results.json, table.md and plots of OUT; runs nothing")
    return p


ORDERS = ("seed-major", "abba")
VARIANT_RE = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*:(.*)$", re.S)


def split_lines(text):
    """'line; line; ...' -> [[words], ...]; empty parts dropped."""
    return [part.split() for part in text.split(";") if part.strip()]


def parse_variant(spec):
    m = VARIANT_RE.match(spec)
    if not m:
        raise UsageError(f"--variant {spec!r}: expected 'NAME: deck line; deck line; ...' "
                         "(NAME of letters, digits, '.', '_', '-'), e.g. 'dense: sync dense'")
    lines = split_lines(m.group(2))
    check_lines(lines, f"--variant {m.group(1)}")
    return {"name": m.group(1), "lines": [" ".join(w) for w in lines]}


def check_lines(lines, where):
    for words in lines:
        if words[0] in HARNESS_COMMANDS:
            raise UsageError(f"{where}: '{words[0]}' is set by {HARNESS_COMMANDS[words[0]]} (expected other commands)")
        if words[0] in ("include", "run") or (words[0] == "variable" and len(words) < 3):
            raise UsageError(f"{where}: '{' '.join(words)}' cannot be a variant line "
                             "(expected a setting such as 'sync local 4' or 'variable NAME VALUE')")


def parse_seeds(text):
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        seeds = []
    if not seeds:
        raise UsageError(f"--seeds {text!r}: expected comma-separated integers, e.g. 1,2,3")
    return seeds


def config_from_args(a):
    """The ablation as plain data (stored in results.json, reused by --report-only)."""
    if not a.deck:
        raise UsageError("no --deck (expected e.g. --deck input/tiny.deck)")
    deck = os.path.abspath(a.deck)
    if not os.path.isfile(deck):
        raise UsageError(f"--deck {a.deck}: no such file (expected a deck such as input/tiny.deck)")
    if not a.variant:
        raise UsageError("no --variant (expected at least one, e.g. --variant 'base:')")
    variants = [parse_variant(v) for v in a.variant]
    names = [v["name"] for v in variants]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise UsageError(f"--variant: name(s) {', '.join(sorted(dup))} given twice (expected distinct names)")
    for name in a.expect_fail:
        if name not in names:
            raise UsageError(f"--expect-fail {name}: no such variant (expected one of {', '.join(names)})")
        next(v for v in variants if v["name"] == name)["expect_fail"] = True
    for name in a.any_end:
        if name not in names:
            raise UsageError(f"--any-end {name}: no such variant (expected one of {', '.join(names)})")
        next(v for v in variants if v["name"] == name)["any_end"] = True
    common = [" ".join(w) for c in a.common for w in split_lines(c)]
    check_lines([c.split() for c in common], "--common")
    binary = os.path.abspath(a.bin)
    if not os.access(binary, os.X_OK):
        raise UsageError(f"--bin {a.bin}: not an executable (expected tools/build to have written it)")
    if a.ranks < 1 or (a.steps is not None and a.steps < 1) or (a.eval_every is not None and a.eval_every < 0):
        raise UsageError("--ranks and --steps must be positive, --eval-every not negative")
    stem = a.title or os.path.splitext(os.path.basename(deck))[0]
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", stem)
    out = os.path.abspath(a.out or os.path.join(ROOT, "runs", "ablate",
                                                f"{stem}-{datetime.datetime.now():%Y%m%d-%H%M%S}"))
    return {"title": a.title or f"{os.path.basename(deck)} ablation", "deck": deck, "variants": variants,
            "seeds": parse_seeds(a.seeds), "ranks": a.ranks, "steps": a.steps, "vars": [list(v) for v in a.var],
            "common": common, "eval_every": a.eval_every, "target_loss": a.target_loss, "out": out,
            "bin": binary, "launcher": [w for l in a.launcher for w in shlex.split(l)],
            "mpirun_args": [w for m in a.mpirun_args for w in shlex.split(m)], "timeout": a.timeout,
            "reload": a.reload, "order": a.order,
            "network": json.loads(a.netsim_shaping) if a.netsim_shaping else None,
            "ckpt_root": os.path.abspath(a.ckpt_root) if a.ckpt_root else None,
            "ckpt_root_clean": bool(a.ckpt_root and a.ckpt_root_clean),
            "storage": json.loads(a.slowdisk_storage) if a.slowdisk_storage else None}


# ---------------------------------------------------------------------------
# deck editing
#
# A deck is read into blocks: one command (with its '&' continuation lines and
# comments) per block, keyed by its command word ('variable NAME' for
# variables). Blocks the harness leaves alone keep their text; a replaced block
# becomes one plain line.


def command_key(words):
    return f"variable {words[1]}" if words and words[0] == "variable" and len(words) > 1 else (words[0] if words else None)


def read_blocks(path):
    blocks, raw, text = [], [], ""
    with open(path) as f:
        for line in f:
            raw.append(line.rstrip("\n"))
            code = line.split("#", 1)[0].rstrip()
            if code.endswith("&"):
                text += code[:-1] + " "
                continue
            text += code
            words = text.split()
            blocks.append({"raw": raw, "words": words, "key": command_key(words)})
            raw, text = [], ""
    if raw:
        words = text.split()
        blocks.append({"raw": raw, "words": words, "key": command_key(words)})
    return blocks


def set_line(blocks, words):
    """Replaces every block of the line's command with the line, or inserts it before the first 'run'
    (a new variable: at the top)."""
    key, new = command_key(words), {"raw": [" ".join(words)], "words": words, "key": command_key(words)}
    hits = [i for i, b in enumerate(blocks) if b["key"] == key]
    for i in hits:
        blocks[i] = dict(new)
    if not hits:  # a new variable goes first, where every line can use it
        runs = [i for i, b in enumerate(blocks) if b["key"] == "run"]
        blocks.insert(0 if words[0] == "variable" else runs[0] if runs else len(blocks), new)


def set_keyword(blocks, command, keyword, value):
    """Sets 'keyword value' on every line of `command` (or adds 'command keyword value')."""
    hits = [b for b in blocks if b["key"] == command]
    if not hits:
        set_line(blocks, [command, keyword, str(value)])
    for b in hits:
        w = list(b["words"])
        if keyword in w[1:-1]:
            w[w.index(keyword, 1) + 1] = str(value)
        else:
            w += [keyword, str(value)]
        b.update(raw=[" ".join(w)], words=w)


def case_deck(cfg, variant, seed, case_dir):
    """The text of one case's deck."""
    blocks = read_blocks(cfg["deck"])
    base_dir = os.path.dirname(cfg["deck"])
    for b in blocks:  # an include is relative to the deck's folder, which the case deck leaves
        if b["key"] == "include" and len(b["words"]) == 2 and "$" not in b["words"][1]:
            b["words"] = ["include", os.path.normpath(os.path.join(base_dir, b["words"][1]))]
            b["raw"] = [" ".join(b["words"])]
    for line in cfg["common"] + variant["lines"]:
        set_line(blocks, line.split())
    set_line(blocks, ["seed", str(seed)])
    set_keyword(blocks, "output", "dir", case_dir)  # the deck's other output keywords stay (barrier, tensorboard)
    set_keyword(blocks, "output", "log_every", 1)
    if cfg["eval_every"] is not None:
        set_keyword(blocks, "eval", "every", cfg["eval_every"])
    rel = os.path.relpath(cfg["deck"], ROOT)
    head = [f"# written by tools/lab/ablate: {rel}, variant {variant['name']} "
            f"({'; '.join(variant['lines']) or 'the deck as it is'}), seed {seed}"]
    return "\n".join(head + [r for b in blocks for r in b["raw"]]) + "\n"


# ---------------------------------------------------------------------------
# provenance: what a case ran (binary, source, libraries, corpus, network, machine)
#
# The hashes are cached by (path, mtime, size): every case looks again (a binary
# rebuilt mid-ablation shows), but each file is read once per ablation.

_SHA = {}


def sha256_file(path):
    """sha256 of a file (hex), or None when it cannot be read; cached by path, mtime and size."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    key = (os.path.realpath(path), st.st_mtime_ns, st.st_size)
    if key not in _SHA:
        h = hashlib.sha256()
        try:
            with open(path, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
        except OSError:
            return None
        _SHA[key] = h.hexdigest()
    return _SHA[key]


def quiet(cmd, timeout=30, any_status=False, **kw):
    """stdout of cmd, or '' when it is missing or fails (any_status: stdout and stderr, whatever its status)."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    except (OSError, subprocess.SubprocessError):
        return ""
    return p.stdout + p.stderr if any_status else p.stdout if p.returncode == 0 else ""


def git_commit():
    """`git rev-parse HEAD` of the repository, '+changes' when a tracked file differs from it."""
    head = quiet(["git", "-C", ROOT, "rev-parse", "HEAD"]).strip()
    if not head:
        return "unknown"
    dirty = quiet(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"]).strip()
    return head + ("+changes" if dirty else "")


def library_versions(binary):
    """Versions of the libraries that matter: Open MPI, HDF5, UCX from their own tools; Kokkos, oneDNN,
    OpenBLAS (and any of the others the tools did not answer for) from the Debian package of the library the
    binary loads (ldd), else the library file's name."""
    v = {}
    m = re.search(r"v?(\d+\.\d+[\w.]*)", quiet(["ompi_info", "--parsable", "--version"]) or
                  quiet(["mpirun", "--version"]).split("\n", 1)[0])
    if m:
        v["openmpi"] = m.group(1)
    h5 = (quiet(["pkg-config", "--modversion", "hdf5-openmpi"]) or quiet(["pkg-config", "--modversion", "hdf5"])).strip()
    if not h5:
        m = re.search(r"HDF5 Version:\s*(\S+)", quiet(["h5pcc", "-showconfig"]))
        h5 = m.group(1) if m else ""
    if h5:
        v["hdf5"] = h5
    m = re.search(r"version:?\s*([\d.]+)", quiet(["ucx_info", "-v"]), re.I)
    ucx = m.group(1) if m else quiet(["pkg-config", "--modversion", "ucx"]).strip()
    if ucx:
        v["ucx"] = ucx
    libs = {"openmpi": "libmpi.so", "hdf5": "libhdf5", "ucx": "libucp.so", "kokkos": "kokkoscore",
            "onednn": "libdnnl.so", "openblas": "libopenblas", "nccl": "libnccl.so"}
    for line in quiet(["ldd", binary]).splitlines():
        m = re.match(r"\s*(\S+) => (/\S+)", line)
        name = next((k for k, pat in libs.items() if m and pat in m.group(1)), None)
        if not name or name in v:
            continue
        real = os.path.realpath(m.group(2))
        owner = quiet(["dpkg-query", "-S", real]).split(":", 1)[0].strip()
        version = quiet(["dpkg-query", "-W", "-f", "${Version}", owner]).strip() if owner else ""
        v[name] = f"{version} ({owner})" if version else os.path.basename(real)
    return v


def cpu_info():
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "")
    except OSError:
        pass
    return {"model": model or "unknown", "cores": os.cpu_count(), "usable": len(os.sched_getaffinity(0))}


def ablation_provenance(cfg):
    """What every case of this ablation shares, computed once: source commit, libraries, CPU, network."""
    network = cfg.get("network") or "none"
    return {"git": git_commit(), "libraries": library_versions(cfg["bin"]), "cpu": cpu_info(), "network": network,
            "storage": cfg.get("storage") or "none"}


_DATA_FIELDS = {}


def data_fields(cfg, env, deck_path, var_pairs):
    """The data files a case deck names, as the binary resolves them (xuanxue -print-config json); cached by the
    deck's data and variable lines and the -var pairs. None when the binary cannot read the deck."""
    blocks = read_blocks(deck_path)
    key = (cfg["bin"], tuple(tuple(b["words"]) for b in blocks if b["key"] and
                             (b["key"] == "data" or b["key"].startswith("variable "))), tuple(map(tuple, var_pairs)))
    if key not in _DATA_FIELDS:
        try:
            d = xxpy.deck.first_phase(deck_path, var_pairs, xuanxue=cfg["bin"], env=env, cwd=ROOT)["data"]
            _DATA_FIELDS[key] = {"format": d["format"], "path": d["path"], "valid": d["valid"],
                                 "tokenizer": d["tokenizer"] or None, "resolved_by": "xuanxue -print-config json"}
        except xxpy.deck.DeckError:
            _DATA_FIELDS[key] = None
    return _DATA_FIELDS[key]


def data_provenance(fields):
    """sha256 of every file the data line names (the corpus glob expanded, the valid file, the tokenizer),
    relative to the repository root as the cases run; 'digest' is one sha256 over them all."""
    if not fields:
        return None
    files = {}
    for role in ("path", "valid", "tokenizer"):
        name = fields.get(role)
        if not name:
            continue
        full = name if os.path.isabs(name) else os.path.join(ROOT, name)
        matches = sorted(glob.glob(full)) if glob.has_magic(full) else [full]
        if role != "path" and not os.path.exists(full):
            continue  # valid 0.05 (a fraction), a tokenizer by name such as bytes
        for m in matches or [full]:
            files[os.path.relpath(m, ROOT) if not os.path.isabs(name) else m] = sha256_file(m)
    digest = hashlib.sha256(json.dumps(sorted(files.items())).encode()).hexdigest()
    return dict(fields, sha256=files, digest=digest)


def backends(console_path):
    """The '# backends' table of a case's console: {'kernels': 'Kokkos 30401 (Serial)', 'gemm': ...}."""
    out = {}
    try:
        with open(console_path, errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return out
    if "# backends" in lines:
        for line in lines[lines.index("# backends") + 1:]:
            m = re.match(r"  (\S(?:.*?\S)?)\s{2,}(\S.*)$", line)
            if not m:
                break
            out[m.group(1)] = m.group(2)
    return out


def short(sha):
    return (sha or "unknown")[:12]


# ---------------------------------------------------------------------------
# running one case


def mpirun_command(cfg, deck_path, case_dir):
    # One rank per core while they fit (as jobs/mpirun.sh does); beyond that they share.
    if cfg["ranks"] <= len(os.sched_getaffinity(0)):
        bind = ["--bind-to", "core"]
    else:
        bind = ["--oversubscribe", "--bind-to", "none"]
    cmd = cfg["launcher"] + ["mpirun", "-n", str(cfg["ranks"])] + bind + cfg["mpirun_args"]
    cmd += [cfg["bin"], "-in", deck_path]
    for name, value in case_vars(cfg, case_dir):
        cmd += ["-var", name, value]
    return cmd


def case_vars(cfg, case_dir):
    """The -var pairs of a case: run_dir, steps, then --var."""
    pairs = [["run_dir", case_dir]] + ([["steps", str(cfg["steps"])]] if cfg["steps"] is not None else [])
    return pairs + [list(v) for v in cfg["vars"]]


def run_case(cfg, env, variant, seed, order_index=None, shared=None):
    """Writes the case's deck and runs it; returns {variant, seed, dir, rc, wall_s, end_unix, command,
    order_index, provenance} (and reload_rc, reload_wall_s with --reload). `shared`: ablation_provenance."""
    rel = os.path.join(variant["name"], f"seed{seed}")
    case_dir = os.path.join(cfg["out"], rel)
    os.makedirs(case_dir)
    if cfg.get("ckpt_root"):  # RUN_DIR/ckpt -> DIR/<variant>/seed<S>, made afresh
        target = os.path.join(cfg["ckpt_root"], rel)
        shutil.rmtree(target, ignore_errors=True)
        os.makedirs(target)
        os.symlink(target, os.path.join(case_dir, "ckpt"))
    deck_path = os.path.join(case_dir, "deck.in")
    with open(deck_path, "w") as f:
        f.write(case_deck(cfg, variant, seed, case_dir))
    cmd = mpirun_command(cfg, deck_path, case_dir)
    case = {"variant": variant["name"], "seed": seed, "dir": rel, "command": shlex.join(cmd),
            "order_index": order_index}
    prov = {"binary": {"path": cfg["bin"], "sha256": sha256_file(cfg["bin"])}}
    prov.update(shared or ablation_provenance(cfg))
    prov["data"] = data_provenance(data_fields(cfg, env, deck_path, case_vars(cfg, case_dir)))
    prov["load_before"] = list(os.getloadavg())
    case["rc"], case["wall_s"], case["end_unix"] = run_logged(cfg, env, cmd, os.path.join(case_dir, "console.txt"))
    prov["load_after"] = list(os.getloadavg())
    prov["backends"] = backends(os.path.join(case_dir, "console.txt"))
    case["provenance"] = prov
    if cfg.get("reload") and case["rc"] == 0:
        cmd = cmd + ["-resume", "auto"]
        case["reload_rc"], case["reload_wall_s"], _ = run_logged(cfg, env, cmd,
                                                                  os.path.join(case_dir, "console_reload.txt"))
    if cfg.get("ckpt_root") and cfg.get("ckpt_root_clean"):
        shutil.rmtree(os.path.join(cfg["ckpt_root"], rel), ignore_errors=True)
    return case


def run_logged(cfg, env, cmd, console_path):
    """Runs cmd with its output in console_path; (exit status or 'timeout', wall seconds, unix time at the end)."""
    t0 = time.monotonic()
    with open(console_path, "w") as console:
        console.write(f"# {shlex.join(cmd)}\n")
        console.flush()
        # its own process group, so that a timeout or Ctrl-C stops mpirun and every rank
        p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=console, stderr=subprocess.STDOUT,
                             start_new_session=True)
        try:
            rc = p.wait(timeout=cfg["timeout"])
        except subprocess.TimeoutExpired:
            stop(p)
            rc = "timeout"
        except BaseException:
            stop(p)
            raise
    return rc, time.monotonic() - t0, time.time()


def stop(p):
    """SIGTERM to the case's process group (mpirun and its ranks), SIGKILL 10 s later."""
    try:
        os.killpg(p.pid, signal.SIGTERM)
        p.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.wait()


def console_tail(out, case, n=12):
    try:
        with open(os.path.join(out, case["dir"], "console.txt"), errors="replace") as f:
            return f.read().strip().splitlines()[-n:]
    except OSError:
        return []


# ---------------------------------------------------------------------------
# figures of one case and of one variant


def read_metrics(path):
    """metrics.jsonl -> records sorted by step (missing file -> [])."""
    return xxpy.metrics.by_step(xxpy.metrics.read(path, missing_ok=True))


def main_loss(record):
    """The next-token loss, comparable with val_loss: 'loss' less the MTP and balance terms."""
    return record.get("loss_main", record["loss"])


def case_summary(records, target_loss):
    """Figures of one case from its metrics.jsonl (logged at every step by the harness).

    train_loss   mean 'loss_main' ('loss' where absent) of the last 10 logged steps
    val_loss     'val_loss' of the last eval
    comm_bytes   sum of 'comm_bytes' (what rank 0 handed to the transport) over steps
    comm_rounds  sum of 'comm_rounds'; comm_s: sum of 'comm_s'
    wire_bytes   sum of 'comm_wire_bytes' (what rank 0 put on the wire: 2(g-1)/g of a ring all-reduce's
                 buffer, what a point-to-point exchange sends); None when no step logged it
    *_per_step   ms_per_step (from train_s), bytes, wire bytes, rounds and comm ms: the sums over steps / steps
    train_s      sum over logged steps of (steps since the previous record) * ms_per_step / 1e3:
                 training time without start-up, eval and checkpoints
    tokens_per_s tokens / train_s, tokens = sum of tokens_per_s * seconds of each record
    target_s     train_s up to and including the first step whose val_loss <= target_loss;
                 target_step that step (None when never reached)
    """
    train = [r for r in records if "loss" in r]
    if not train:
        return None
    s = {"steps": train[-1]["step"], "records": len(train),
         "train_loss": statistics.fmean(main_loss(r) for r in train[-LAST_N:]),
         "comm_bytes": sum(r.get("comm_bytes", 0) for r in train),
         "comm_rounds": sum(r.get("comm_rounds", 0) for r in train),
         "comm_s": sum(r.get("comm_s", 0.0) for r in train)}
    wired = [r["comm_wire_bytes"] for r in train if "comm_wire_bytes" in r]
    s["wire_bytes"] = sum(wired) if wired else None
    vals = [r for r in records if "val_loss" in r]
    s["val_loss"] = vals[-1]["val_loss"] if vals else None
    elapsed, tokens, prev, at = 0.0, 0.0, 0, {}
    for r in train:
        dt = (r["step"] - prev) * r["ms_per_step"] / 1e3
        elapsed, tokens, prev = elapsed + dt, tokens + r["tokens_per_s"] * dt, r["step"]
        at[r["step"]] = elapsed
    s["train_s"] = elapsed
    s["tokens_per_s"] = tokens / elapsed if elapsed > 0 else None
    s["ms_per_step"] = 1e3 * elapsed / s["steps"]
    s["bytes_per_step"] = s["comm_bytes"] / s["steps"]
    s["wire_bytes_per_step"] = s["wire_bytes"] / s["steps"] if wired else None
    s["rounds_per_step"] = s["comm_rounds"] / s["steps"]
    s["comm_ms_per_step"] = 1e3 * s["comm_s"] / s["steps"]
    s["target_step"] = s["target_s"] = None
    if target_loss is not None:
        hit = next((r for r in vals if r["val_loss"] <= target_loss), None)
        if hit:
            s["target_step"], s["target_s"] = hit["step"], at.get(hit["step"])
    return s


METRICS = ("train_loss", "val_loss", "comm_bytes", "comm_rounds", "comm_s", "train_s", "wall_s", "tokens_per_s",
           "ms_per_step", "bytes_per_step", "rounds_per_step", "comm_ms_per_step", "target_s", "target_step",
           "wire_bytes", "wire_bytes_per_step")
RELATIVE = {"val_loss": "difference", "train_loss": "difference", "comm_bytes": "ratio", "wire_bytes": "ratio",
            "tokens_per_s": "ratio", "train_s": "ratio", "target_s": "ratio"}


def stats(values):
    v = [x for x in values if x is not None]
    if not v:
        return None
    return {"n": len(v), "mean": statistics.fmean(v), "sd": statistics.stdev(v) if len(v) > 1 else 0.0,
            "median": statistics.median(v), "min": min(v), "max": max(v)}


def of_seeds(cfg, cases):
    """The cases of the command's seeds: results.json may also keep finished cases of other seeds (an earlier,
    longer look), which stay on disk but are not this command's table."""
    return [c for c in cases if c["seed"] in cfg["seeds"]]


def variant_summary(cfg, cases):
    """Per variant across seeds: mean, sd, median, min, max of each figure, over the cases that ran.

    Relative figures compare each seed with the first variant's case of the same
    seed (run next to it: just before, or with --order abba on every second seed
    just after), then average over seeds:
      difference: 100 * (x - x_base) / x_base  (in %; val_loss, train_loss)
      ratio:      x / x_base                   (comm_bytes, wire_bytes, tokens_per_s, train_s, target_s)
    """
    ok = [c for c in of_seeds(cfg, cases) if c.get("rc") == 0 and c.get("summary")]
    figure = lambda c, k: c["wall_s"] if k == "wall_s" else c["summary"].get(k)
    base_name = cfg["variants"][0]["name"]
    base = {c["seed"]: c for c in ok if c["variant"] == base_name}
    out = {}
    for v in cfg["variants"]:
        mine = [c for c in ok if c["variant"] == v["name"]]
        row = {"cases": len(mine), "of": len(cfg["seeds"]), "lines": v["lines"]}
        row.update({k: stats([figure(c, k) for c in mine]) for k in METRICS})
        rel = {}
        for k, how in RELATIVE.items():
            pairs = [(figure(c, k), figure(base[c["seed"]], k)) for c in mine if c["seed"] in base]
            pairs = [(x, b) for x, b in pairs if x is not None and b]
            rel[k] = stats([100 * (x - b) / b if how == "difference" else x / b for x, b in pairs])
        row["relative"] = rel
        out[v["name"]] = row
    return out


# ---------------------------------------------------------------------------
# the table


def fmt(s, f, scale=1.0):
    """'mean ± sd' of a stats dict (just the mean for one case; '-' for none)."""
    if s is None:
        return "-"
    m = format(s["mean"] * scale, f)
    return m if s["n"] < 2 else f"{m} ± {format(s['sd'] * scale, f.lstrip('+'))}"


def provenance_lines(cfg, cases):
    """The table's provenance: the binary, source commit, libraries, corpus, network and CPU of the cases
    (each distinct value with its count when they differ) and any mix accepted by --resume-any-binary."""
    provs = [c["provenance"] for c in cases if c.get("provenance")]
    if not provs:
        return []

    def distinct(get):
        seen = {}
        for p in provs:
            k = get(p)
            seen[k] = seen.get(k, 0) + 1
        return ", ".join(k if len(seen) == 1 else f"{k} ({n} cases)" for k, n in seen.items())

    libs = lambda p: ", ".join(f"{k} {v.split(' (')[0]}" for k, v in sorted(p.get("libraries", {}).items()))
    net = lambda p: (p["network"] if isinstance(p.get("network"), str) else f"tbf {p['network'].get('rate')}"
                     + (f" uplinks of {p['network']['nodes']} nodes of {p['network'].get('ranks_per_node')} ranks"
                        if p["network"].get("nodes") else ""))  # tools/lab/netsim --nodes
    st = lambda p: p.get("storage") or "none"  # cases from before the key: none
    disk = lambda p: (st(p) if isinstance(st(p), str) else
                      f"{st(p).get('fs', 'throttled')}, write {st(p).get('write_mbps')} MB/s, "
                      f"read {st(p).get('read_mbps') or 'unlimited'} MB/s")
    cpu = lambda p: f"{p['cpu']['model']}, {p['cpu']['usable']} of {p['cpu']['cores']} cores"
    data = lambda p: short((p.get("data") or {}).get("digest")) if p.get("data") else "-"
    out = [f"provenance: binary sha256 {distinct(lambda p: short(p['binary']['sha256']))}; source "
           f"{distinct(lambda p: short_commit(p.get('git')))}; corpus+tokenizer digest {distinct(data)}; "
           f"{distinct(libs)}; network {distinct(net)}; "
           + (f"storage {distinct(disk)}; " if any(st(p) != "none" for p in provs) else "")
           + f"CPU {distinct(cpu)}; "
           f"load (1 min) before/after a case {min(p['load_before'][0] for p in provs):.2f}-"
           f"{max(p['load_after'][0] for p in provs):.2f}."]
    for m in cfg.get("mixed") or []:
        out.append(f"MIXED (--resume-any-binary, {m['when']}): {m['what']}")
    return out


def table_md(cfg, summary, failures, cases=None):
    base = cfg["variants"][0]["name"]
    wire = any(r.get("wire_bytes") for r in summary.values())
    cols = ["variant", "seeds", "train loss", "val loss", f"Δ val % vs {base}", "MB/rank", f"bytes × {base}"]
    cols += ["wire MB/rank", "wire KB/step"] if wire else []
    cols += ["rounds", "train s", "wall s", "tok/s", f"tok/s × {base}"]
    if cfg["target_loss"] is not None:
        cols += [f"s to val ≤ {cfg['target_loss']:g}", "step", "reached"]
    rows = []
    for name, r in summary.items():
        rel = r["relative"]
        row = [name, f"{r['cases']}/{r['of']}", fmt(r["train_loss"], ".4f"), fmt(r["val_loss"], ".4f"),
               fmt(rel["val_loss"], "+.2f"), fmt(r["comm_bytes"], ".3g", 1e-6), fmt(rel["comm_bytes"], ".3g")]
        if wire:
            row += [fmt(r.get("wire_bytes"), ".3g", 1e-6), fmt(r.get("wire_bytes_per_step"), ".4g", 1e-3)]
        row += [fmt(r["comm_rounds"], ".0f"), fmt(r["train_s"], ".1f"), fmt(r["wall_s"], ".1f"),
               fmt(r["tokens_per_s"], ".0f"), fmt(rel["tokens_per_s"], ".3f")]
        if cfg["target_loss"] is not None:
            t = r["target_s"]
            row += [fmt(t, ".1f"), fmt(r["target_step"], ".0f"), f"{t['n'] if t else 0}/{r['cases']}"]
        rows.append(row)
    steps = cfg["steps"] if cfg["steps"] is not None else "as the deck says"
    lines = [f"# {cfg['title']}", "",
             f"deck `{os.path.relpath(cfg['deck'], ROOT)}`, {cfg['ranks']} ranks, seeds "
             f"{','.join(map(str, cfg['seeds']))}, steps {steps}"
             + (f", eval every {cfg['eval_every']}" if cfg["eval_every"] is not None else "")
             + (f", common `{'; '.join(cfg['common'])}`" if cfg["common"] else "")
             + (f", vars `{' '.join(f'{n}={v}' for n, v in cfg['vars'])}`" if cfg["vars"] else "")
             + (f", launcher `{shlex.join(cfg['launcher'])}`" if cfg["launcher"] else "")
             + (f", mpirun `{shlex.join(cfg['mpirun_args'])}`" if cfg["mpirun_args"] else "")
             + f", order {cfg.get('order', 'seed-major')}", ""]
    lines += [f"- `{v['name']}`: " + ("; ".join(f"`{l}`" for l in v["lines"]) or "the deck as it is")
              for v in cfg["variants"]]
    lines += ["", "| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    lines += ["", f"mean ± sd over seeds. train loss: next-token loss (loss_main), mean of the last {LAST_N} steps; val loss: the last eval; "
              "MB/rank: bytes rank 0 handed to the transport, summed over steps (1e6 B); "
              + ("wire MB/rank: bytes rank 0 put on the wire (comm_wire_bytes: 2(g-1)/g of a ring all-reduce's "
                 "buffer, what an exchange sends), summed; wire KB/step: per step (1e3 B); " if wire else "")
              + "rounds: summed; "
              "train s: sum of ms_per_step (no start-up, eval, checkpoints); wall s: the whole mpirun; "
              f"Δ and × compare each seed with {base}'s case of the same seed."]
    lines += [""] + provenance_lines(cfg, cases) if cases and provenance_lines(cfg, cases) else []
    if cfg["target_loss"] is not None:
        lines += [f"s to val ≤ {cfg['target_loss']:g}: train s up to the first eval at or below it "
                  "(mean over the seeds that reached it)."]
    total, ran = len(cfg["seeds"]) * len(cfg["variants"]), sum(r["cases"] for r in summary.values())
    lines += ["", f"OK: all {total} cases ran" if ran == total else
              f"FAILED: {ran} of {total} cases ran to the end ({len(failures)} failed, {total - ran - len(failures)} not run)"]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------
# plots


def series(out, case):
    recs = read_metrics(os.path.join(out, case["dir"], "metrics.jsonl"))
    train = [r for r in recs if "loss" in r]
    vals = [r for r in recs if "val_loss" in r]
    cum, total = [], 0
    for r in train:
        total += r.get("comm_bytes", 0)
        cum.append(total)
    return {"step": [r["step"] for r in train], "loss": [main_loss(r) for r in train], "cum_bytes": cum,
            "val_step": [r["step"] for r in vals], "val": [r["val_loss"] for r in vals]}


def plots(cfg, cases):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    data = {v["name"]: [series(cfg["out"], c) for c in cases
                        if c["variant"] == v["name"] and c.get("summary")] for v in cfg["variants"]}
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]

    def mean_band(runs, xkey, ykey):
        """Mean and min-max over seeds, on the steps every seed logged."""
        common = sorted(set.intersection(*(set(r[xkey]) for r in runs)))
        ys = np.array([[dict(zip(r[xkey], r[ykey]))[x] for x in common] for r in runs])
        return np.array(common), ys.mean(0), ys.min(0), ys.max(0)

    def figure(name, ylabel, draw, log=False):
        fig, ax = plt.subplots(figsize=(8, 5))
        for i, (variant, runs) in enumerate(data.items()):
            if runs:
                draw(ax, variant, runs, colors[i % len(colors)])
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        if log:
            ax.set_yscale("log")
        ax.set_title(f"{cfg['title']} ({cfg['ranks']} ranks, seeds {','.join(map(str, cfg['seeds']))})")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
        fig.tight_layout()
        fig.savefig(os.path.join(cfg["out"], name), dpi=110)
        plt.close(fig)

    def loss(ax, variant, runs, c):
        for r in runs:  # each seed, thin; the mean over seeds smoothed, thick
            ax.plot(r["step"], r["loss"], color=c, lw=0.5, alpha=0.3)
        x, m, _, _ = mean_band(runs, "step", "loss")
        w = max(1, len(x) // 40)
        if len(x) >= w:
            ax.plot(x[w - 1:], np.convolve(m, np.ones(w) / w, "valid"), color=c, lw=2,
                    label=f"{variant} (mean of {len(runs)}" + (f", running mean of {w})" if w > 1 else ")"))

    def val(ax, variant, runs, c):
        runs = [r for r in runs if r["val_step"]]
        if runs:
            x, m, lo, hi = mean_band(runs, "val_step", "val")
            ax.plot(x, m, "o-", color=c, ms=3, label=f"{variant} (mean of {len(runs)}, band min-max)")
            ax.fill_between(x, lo, hi, color=c, alpha=0.2)
        if cfg["target_loss"] is not None:
            ax.axhline(cfg["target_loss"], color="gray", ls="--", lw=0.8)

    def comm(ax, variant, runs, c):
        x, m, lo, hi = mean_band(runs, "step", "cum_bytes")
        keep = m > 0  # log scale: a variant that sends nothing has no line
        if keep.any():
            ax.plot(x[keep], m[keep], color=c, label=f"{variant} ({m[-1] / 1e6:.3g} MB)")
            ax.fill_between(x[keep], lo[keep], hi[keep], color=c, alpha=0.2)

    figure("loss.png", "train loss (next token)", loss)
    figure("val_loss.png", "val loss", val)
    figure("bytes.png", "cumulative bytes per rank (rank 0)", comm, log=True)


# ---------------------------------------------------------------------------
# results.json, the report, and the runs


def write_results(cfg, cases):
    summary = variant_summary(cfg, cases)
    doc = {"tool": "tools/lab/ablate", "config": cfg, "cases": cases, "variants": summary}
    tmp = os.path.join(cfg["out"], RESULTS + ".tmp")
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, os.path.join(cfg["out"], RESULTS))
    return summary


def report(cfg, cases, draw=True):
    """Recomputes every case's figures from its metrics.jsonl, then results.json, table.md, plots (not with
    draw False: a rerun that ran nothing keeps the plots it has)."""
    for c in cases:
        c["summary"] = case_summary(read_metrics(os.path.join(cfg["out"], c["dir"], "metrics.jsonl")),
                                    cfg["target_loss"])
    mine = of_seeds(cfg, cases)
    failures = [c for c in mine if not finished(cfg, c)]
    summary = write_results(cfg, cases)
    text = table_md(cfg, summary, failures, mine)
    with open(os.path.join(cfg["out"], "table.md"), "w") as f:
        f.write(text)
    try:
        if draw or not os.path.isfile(os.path.join(cfg["out"], "loss.png")):
            plots(cfg, mine)
    except Exception as e:  # a missing matplotlib must not cost the table
        print(f"# plots not written: {type(e).__name__}: {e}")
    return text, failures


def load_results(out):
    path = os.path.join(out, RESULTS)
    if not os.path.isfile(path):
        raise UsageError(f"{path}: no such file (expected the OUT folder of an earlier tools/lab/ablate run)")
    with open(path) as f:
        doc = json.load(f)
    doc["config"]["out"] = os.path.abspath(out)  # the folder may have moved
    return doc


def finished(cfg, case):
    """A case that needs no rerun: it ran to its end (exit 0, metrics; with --reload, the reload too), or a
    variant that is meant to fail (`expect_fail`, tools/lab/verdicts' faults) failed, without a timeout, or a
    variant whose every end counts (`any_end`: it ran on, failed, or hung until --timeout)."""
    v = next((v for v in cfg["variants"] if v["name"] == case["variant"]), {})
    if v.get("any_end"):
        return case.get("rc") is not None
    if v.get("expect_fail"):
        return case.get("rc") not in (0, None, "timeout")
    return case.get("rc") == 0 and bool(case.get("summary")) and (not cfg.get("reload") or case.get("reload_rc") == 0)


# What must match for --resume to continue an ablation (the rest, such as the timeout or the seeds, may change).
SAME_ABLATION = ("deck", "variants", "ranks", "steps", "vars", "common", "eval_every", "launcher",
                 "mpirun_args", "reload", "order", "network", "storage")
DEFAULTS = {"order": "seed-major"}  # what a results.json from before the key meant


def comparable(cfg, key):
    value = cfg.get(key, DEFAULTS.get(key))
    if key == "launcher":  # tools/lab/netsim's namespace is named after its process: a new one each run
        value = [re.sub(r"^xxnetsim\d+$", "xxnetsim<pid>", w) for w in value or []]
        # tools/lab/slowdisk's cgroup and mount (xxslowdisk<pid>, in paths too): a new one each run
        value = [re.sub(r"xxslowdisk\d+", "xxslowdisk<pid>", w) for w in value]
    return value or None


def mixing(cfg, keep):
    """What the kept cases ran that the cases to come would not: another binary (sha256 of --bin now),
    corpus or tokenizer (the sha256 of the files their data line names, now). [] when nothing differs."""
    problems, now_bin = [], sha256_file(cfg["bin"])
    now_git = git_commit()
    old_bins = {}
    for c in keep:
        p = c.get("provenance") or {}
        sha = (p.get("binary") or {}).get("sha256")
        if sha and sha != now_bin:
            old_bins.setdefault(sha, set()).add(p.get("git", "unknown"))
    for sha, commits in old_bins.items():
        n = sum(1 for c in keep if ((c.get("provenance") or {}).get("binary") or {}).get("sha256") == sha)
        problems.append(f"{n} finished case(s) ran binary sha256 {short(sha)} (source tree "
                        f"{' or '.join(sorted(short_commit(g) for g in commits))}), but --bin {cfg['bin']} is "
                        f"sha256 {short(now_bin)} (source tree {short_commit(now_git)})")
    changed = {}
    for c in keep:
        data = (c.get("provenance") or {}).get("data") or {}
        now = data_provenance({k: data.get(k) for k in ("format", "path", "valid", "tokenizer")}) if data else None
        for path, sha in sorted((data.get("sha256") or {}).items()):
            new = (now or {}).get("sha256", {}).get(path)
            if new != sha:
                changed[path] = (sha, new)
        for path in sorted(set((now or {}).get("sha256", {})) - set(data.get("sha256") or {})):
            changed[path] = (None, now["sha256"][path])
    for path, (old, new) in changed.items():
        problems.append(f"corpus/tokenizer file {path} was sha256 {short(old) if old else 'absent'} when the "
                        f"finished cases ran, is {short(new) if new else 'absent'} now")
    return problems


def short_commit(git):
    head, _, rest = (git or "unknown").partition("+")
    return head[:10] + ("+" + rest if rest else "")


def kept_cases(cfg, any_binary=False):
    """--resume: the finished cases of OUT's results.json, of any seed (their folders stay); every other case
    folder of the command's seeds is removed, to run again. Refuses (UsageError, before anything is written) when the finished cases ran
    another binary or corpus, unless any_binary (--resume-any-binary): then the mix goes into cfg['mixed']."""
    doc = load_results(cfg["out"])
    old = doc["config"]
    changed = [k for k in SAME_ABLATION if comparable(old, k) != comparable(cfg, k)]
    if changed:
        raise UsageError(f"--resume {cfg['out']}: it holds another ablation ({', '.join(changed)} differ; expected "
                         "the same command line, or a new --out)")
    # Every finished case stays, whatever its seed: a first look on seeds 1..5 after a second look on 1..8
    # keeps seeds 6..8 (the table and the judge take the command's seeds, `of_seeds`).
    keep = [c for c in doc["cases"] if finished(cfg, c)]
    cfg["mixed"] = list(old.get("mixed") or [])
    problems = mixing(cfg, keep)
    if problems and not any_binary:
        raise UsageError(f"--resume {cfg['out']}: refusing to mix programs or data in one ablation: "
                         + "; ".join(problems) + ". Expected the same --bin and corpus as the finished cases: "
                         "run the ablation again in a new --out, or add --resume-any-binary to accept the mix "
                         "(recorded in results.json and the table)")
    if problems:
        cfg["mixed"].append({"when": f"{datetime.datetime.now():%Y-%m-%d %H:%M}", "what": "; ".join(problems)})
        print(f"# tools/lab/ablate: --resume-any-binary: mixing: {'; '.join(problems)}", flush=True)
    unknown = sum(1 for c in keep if not c.get("provenance"))
    if unknown:
        print(f"# tools/lab/ablate: {unknown} finished case(s) predate provenance: their binary and corpus are "
              "unknown; kept", flush=True)
    kept = {c["dir"] for c in keep}
    for v in cfg["variants"]:
        for seed in cfg["seeds"]:
            rel = os.path.join(v["name"], f"seed{seed}")
            if rel not in kept and os.path.isdir(os.path.join(cfg["out"], rel)):
                shutil.rmtree(os.path.join(cfg["out"], rel))
    return keep


def case_order(seeds, variants, order="seed-major"):
    """The (seed, variant) pairs in the order they run: seed-major, the variants in the given order for
    each seed; abba: the given order for the 1st, 3rd, ... seed, reversed for the 2nd, 4th, ..."""
    return [(s, v) for i, s in enumerate(seeds)
            for v in (variants[::-1] if order == "abba" and i % 2 == 1 else variants)]


def run_all(cfg, resume=False, any_binary=False):
    """Runs every case not finished before; returns (all cases, how many ran now)."""
    cases = []
    if resume and os.path.isfile(os.path.join(cfg["out"], RESULTS)):
        cases = kept_cases(cfg, any_binary)
    elif os.path.isdir(cfg["out"]) and os.listdir(cfg["out"]):
        raise UsageError(f"--out {cfg['out']}: not empty (expected a new folder; every case needs a fresh run dir)")
    os.makedirs(cfg["out"], exist_ok=True)
    env = sourced_env()
    shared = None  # the ablation's provenance, taken when the first case runs (a rerun with nothing left takes none)
    ran = 0
    order = case_order(cfg["seeds"], cfg["variants"], cfg.get("order", "seed-major"))  # interleaved
    print(f"# tools/lab/ablate: {cfg['title']}: {len(cfg['variants'])} variants x {len(cfg['seeds'])} seeds "
          f"on {cfg['ranks']} ranks, one case at a time -> {cfg['out']}"
          + (f" ({len(cases)} finished before, kept)" if cases else ""), flush=True)
    done = {(c["variant"], c["seed"]) for c in cases}
    write_results(cfg, cases)
    for i, (seed, v) in enumerate(order):
        if (v["name"], seed) in done:
            continue
        shared = shared or ablation_provenance(cfg)
        ran += 1
        case = run_case(cfg, env, v, seed, order_index=i, shared=shared)
        case["summary"] = case_summary(read_metrics(os.path.join(cfg["out"], case["dir"], "metrics.jsonl")),
                                       cfg["target_loss"])
        cases.append(case)
        write_results(cfg, cases)  # after every case, so that an interrupted ablation can still be reported
        s = case["summary"]
        head = f"# case {i + 1}/{len(order)}: {v['name']} seed {seed}:"
        if v.get("any_end") and case["rc"] != 0:
            print(f"{head} " + (f"hung: stopped at --timeout {cfg['timeout']:g} s" if case["rc"] == "timeout" else
                                f"failed (exit status {case['rc']})") + f", {case['wall_s']:.1f} s wall", flush=True)
        elif finished(cfg, case) and v.get("expect_fail"):
            print(f"{head} failed as intended (exit status {case['rc']}), {case['wall_s']:.1f} s wall", flush=True)
        elif case["rc"] == 0 and s:
            val = f"{s['val_loss']:.4f}" if s["val_loss"] is not None else "-"
            print(f"{head} loss {s['train_loss']:.4f}, val {val}, {s['comm_bytes'] / 1e6:.3g} MB/rank, "
                  f"{s['train_s']:.1f} s training, {case['wall_s']:.1f} s wall", flush=True)
        else:
            why = ("no metrics.jsonl records" if case["rc"] == 0 else f"stopped after --timeout {cfg['timeout']:g} s"
                   if case["rc"] == "timeout" else f"exit status {case['rc']}")
            print(f"{head} FAILED ({why}); last lines of {os.path.join(case['dir'], 'console.txt')}:", flush=True)
            for line in console_tail(cfg["out"], case):
                print(f"#   {line}")
    return cases, ran


def interrupt(signum, frame):
    """SIGTERM and SIGHUP end the harness as Ctrl-C does: the running case is stopped first."""
    raise KeyboardInterrupt


def main(argv=None):
    args = parser().parse_args(argv)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, interrupt)
    cfg, ran = None, None
    try:
        if args.report_only:
            doc = load_results(args.report_only)
            cfg, cases = doc["config"], doc["cases"]
        else:
            cfg = config_from_args(args)
            if args.resume_any_binary and not args.resume:
                raise UsageError("--resume-any-binary: only with --resume")
            cases, ran = run_all(cfg, resume=args.resume, any_binary=args.resume_any_binary)
    except UsageError as e:
        print(f"tools/lab/ablate: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if cfg:
            print(f"tools/lab/ablate: interrupted; to report the cases that ran: tools/lab/ablate --report-only {cfg['out']}",
                  file=sys.stderr)
        return 130
    text, failures = report(cfg, cases, draw=ran != 0)
    print(text, end="")
    for c in failures:
        print(f"#   failed: {c['variant']} seed {c['seed']}: exit status {c.get('rc')}, see {c['dir']}/console.txt")
    print(f"# written: {os.path.join(cfg['out'], 'results.json')}, table.md, loss.png, val_loss.png, bytes.png")
    return 0 if len(of_seeds(cfg, cases)) - len(failures) == len(cfg["seeds"]) * len(cfg["variants"]) else 1
