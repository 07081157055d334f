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

# Resumes the old checkpoint to step 8 in $T/NAME; its steps 6-8 go to $T/NAME.jsonl.
resume_old() {  # resume_old NAME
  mkdir -p "$T/$1/ckpt"
  cp "$data/step_00000005.h5" "$T/$1/ckpt/"
  run_xx 2 -in "$data/deck" -var data "$data/corpus.txt" -var run_dir "$T/$1" -resume "$T/$1/ckpt/step_00000005.h5"
  check [ "$RC" -eq 0 ] || { fail "exit code $RC (expected 0)"; show_run; }
  curve "$T/$1/metrics.jsonl" "$T/$1.jsonl" 5
}

begin "resume a version-2 checkpoint of main 419efe6"
resume_old run
check grep -q "resumed from .*step_00000005.h5 at step 5" "$T/out" || fail "no 'resumed from ... at step 5' line"
said=$(/usr/bin/python3 "$here/../golden/compare.py" close "$data/expected.jsonl" "$T/run.jsonl") ||
  fail "steps 6-8 differ from the old binary's uninterrupted run beyond the tolerances: $said"

begin "the old checkpoint resumed again: the same bits"
resume_old again
check cmp -s "$T/run.jsonl" "$T/again.jsonl" || fail "two resumes of the same checkpoint logged different steps 6-8"
finish
