#!/usr/bin/env bash
# A checkpoint written by main 419efe6, before the state registry (issue
# 7/13), still resumes: tests/data/v2_checkpoint holds its deck, corpus,
# step 5 of 8 and the old binary's uninterrupted metrics of steps 6-8.
# Until issue 8/13 the resumed run logged exactly those; since then bf16 (the
# deck's precision) multiplies real bf16 operands instead of rounding fp32
# ones, so steps 6-8 must agree within tests/golden/compare.py's tolerances
# (they differ by ~1e-5 relative: the same state, three steps of other
# arithmetic); resumed twice, it logs the same bits.
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/lib.sh"
data="$here/../data/v2_checkpoint"

# The records of steps 6-8 of metrics.jsonl IN, timings aside, into OUT.
steps_after_5() {
  /usr/bin/python3 - "$1" "$2" <<'PY'
import json, sys
timings = {"ms_per_step", "tokens_per_s", "mfu", "comm_s"}
with open(sys.argv[1]) as f, open(sys.argv[2], "w") as out:
    for line in f:
        rec = {k: v for k, v in json.loads(line).items() if k not in timings}
        if rec["step"] > 5: out.write(json.dumps(rec, sort_keys=True) + "\n")
PY
}

begin "resume a version-2 checkpoint of main 419efe6"
mkdir -p "$T/run/ckpt"
cp "$data/step_00000005.h5" "$T/run/ckpt/"
run_xx 2 -in "$data/deck" -var data "$data/corpus.txt" -var run_dir "$T/run" \
  -resume "$T/run/ckpt/step_00000005.h5"
check [ "$RC" -eq 0 ] || { fail "exit code $RC (expected 0)"; show_run; }
check grep -q "resumed from .*step_00000005.h5 at step 5" "$T/out" || fail "no 'resumed from ... at step 5' line"
steps_after_5 "$T/run/metrics.jsonl" "$T/got.jsonl"
said=$(/usr/bin/python3 "$here/../golden/compare.py" close "$data/expected.jsonl" "$T/got.jsonl") ||
  fail "steps 6-8 differ from the old binary's uninterrupted run beyond the tolerances: $said"

begin "the old checkpoint resumed again: the same bits"
mkdir -p "$T/again/ckpt"
cp "$data/step_00000005.h5" "$T/again/ckpt/"
run_xx 2 -in "$data/deck" -var data "$data/corpus.txt" -var run_dir "$T/again" \
  -resume "$T/again/ckpt/step_00000005.h5"
check [ "$RC" -eq 0 ] || { fail "exit code $RC (expected 0)"; show_run; }
steps_after_5 "$T/again/metrics.jsonl" "$T/again.jsonl"
check cmp -s "$T/got.jsonl" "$T/again.jsonl" || fail "two resumes of the same checkpoint logged different steps 6-8"
finish
