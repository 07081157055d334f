#!/usr/bin/env bash
# A checkpoint written by main 419efe6, before the state registry (issue
# 7/13), still resumes bit for bit: tests/data/v2_checkpoint holds its deck,
# corpus, step 5 of 8 and the old binary's uninterrupted metrics of steps
# 6-8. The resumed run must log exactly those (timings aside).
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/lib.sh"
data="$here/../data/v2_checkpoint"

begin "resume a version-2 checkpoint of main 419efe6"
mkdir -p "$T/run/ckpt"
cp "$data/step_00000005.h5" "$T/run/ckpt/"
run_xx 2 -in "$data/deck" -var data "$data/corpus.txt" -var run_dir "$T/run" \
  -resume "$T/run/ckpt/step_00000005.h5"
check [ "$RC" -eq 0 ] || { fail "exit code $RC (expected 0)"; show_run; }
check grep -q "resumed from .*step_00000005.h5 at step 5" "$T/out" || fail "no 'resumed from ... at step 5' line"
/usr/bin/python3 - "$T/run/metrics.jsonl" "$T/got.jsonl" <<'PY'
import json, sys
timings = {"ms_per_step", "tokens_per_s", "mfu", "comm_s"}
with open(sys.argv[1]) as f, open(sys.argv[2], "w") as out:
    for line in f:
        rec = {k: v for k, v in json.loads(line).items() if k not in timings}
        if rec["step"] > 5: out.write(json.dumps(rec, sort_keys=True) + "\n")
PY
check cmp -s "$data/expected.jsonl" "$T/got.jsonl" || {
  fail "steps 6-8 differ from the old binary's uninterrupted run"
  diff "$data/expected.jsonl" "$T/got.jsonl" | cut -c1-300 | head -6 >&2
}
finish
