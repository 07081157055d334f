"""A deck's resolved values, from the one deck reader there is: the binary's
`xuanxue -in DECK [-var NAME VALUE]... -print-config json` (src/deck/). Python
never parses a deck, so its defaults, variables, includes and phases are the
run's own."""
import json
import os
import subprocess
import tempfile

from . import ROOT


class DeckError(Exception):
    """The binary refused the deck (its one-line message) or is missing."""


def binary():
    """build/xuanxue, or $XUANXUE_BIN (another build directory)."""
    return os.environ.get("XUANXUE_BIN") or os.path.join(ROOT, "build", "xuanxue")


def phases(deck_path, variables=(), xuanxue=None, env=None, cwd=None):
    """Every phase of the deck: [{"where": "FILE:LINE", "steps": N, "config": {command: {keyword: value}}}].
    variables: (name, value) pairs, as -var; cwd: where `include` paths start. Files the deck names need
    not exist."""
    cmd = [xuanxue or binary(), "-in", deck_path, "-print-config", "json"]
    for name, value in variables:
        cmd += ["-var", name, str(value)]
    run_env = dict(os.environ if env is None else env)
    run_env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")  # a singleton, root or not
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=run_env, cwd=cwd, timeout=120)
    except FileNotFoundError:
        raise DeckError(f"{cmd[0]}: not built (expected tools/build, or XUANXUE_BIN naming the binary)")
    if p.returncode != 0:
        raise DeckError(p.stderr.strip().splitlines()[0] if p.stderr.strip() else f"{cmd[0]}: exit {p.returncode}")
    return json.loads(p.stdout)["phases"]


def first_phase(deck_path, variables=(), **kw):
    """The configuration in force at the first `run` (the model, the data: one per job)."""
    return phases(deck_path, variables, **kw)[0]["config"]


def text_phases(text, **kw):
    """phases() of a deck given as text (the resolved deck a checkpoint keeps). A checkpoint's deck may describe
    the model alone (tests/parity_dump writes its model and precision lines only): a placeholder data line and one
    `run` then make it a program whose one phase is that model (no file is read: -print-config checks none)."""
    commands = {line.split()[0] for line in text.splitlines() if line.split() and not line.lstrip().startswith("#")}
    if "run" not in commands:
        text += ("" if "data" in commands else "\ndata bytes model-only-deck") + "\nrun 1\n"
    with tempfile.NamedTemporaryFile("w", suffix=".deck", prefix="xx-") as f:
        f.write(text)
        f.flush()
        return phases(f.name, **kw)
