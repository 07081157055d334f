# Resilience at 4 ranks (docs/RESILIENCE.md), with the deck's fault injection:
#   - an injected NaN is skipped on every rank at once (health nan skip), or
#     stops the job with one message naming the rank (health nan stop, exit 3);
#   - a rank killed with SIGKILL ends the job within 60 s, named; so does an
#     exception on one rank (MPI_Abort), which is also in that rank's log;
#   - SIGTERM to one rank: every rank stops at the step boundary, checkpoints,
#     exits 0; -resume auto then gives the uninterrupted run's losses bit for bit;
#   - the same after a SIGKILL of deepseek-tiny (MLA, MoE, MTP) under sync
#     local 4 in clusters, then dense with compression and feedback, with diff
#     checkpoints (issue 5/6's resume test);
#   - SIGUSR1 to mpiexec reaches the ranks and stops the job the same way;
#   - a second signal exits at once.
# usage: resilience.sh XUANXUE [MPIEXEC]
source "$(dirname "$0")/lib.sh"

make_corpus "$T/corpus.txt"
# base_deck PATH LINES...: the tiny model, logging every step, then LINES.
base_deck() {
  local path=$1
  shift
  {
    echo "seed 1"
    echo "model dense vocab 256 dim 32 layers 1 heads 2 ffn 64 seq 16"
    echo "data bytes $T/corpus.txt valid 0.1 batch 2 workers 1"
    echo "peak_gflops 50"
    echo 'output dir ${run_dir} log_every 1 tensorboard off'
    echo "eval every 0 batches 1"
    printf '%s\n' "$@"
  } >"$path"
}

# losses RUN_DIR: "step loss" for every logged step, the last record of a step
# winning (a killed run may have logged steps that the resume repeats).
losses() {
  /usr/bin/python3 - "$1/metrics.jsonl" <<'EOF'
import json, sys
last = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "loss" in r:
        last[r["step"]] = r["loss"]
for step in sorted(last):
    print(step, repr(last[step]))
EOF
}

run_timed() {  # run_xx, and ELAPSED: its wall seconds
  local start
  start=$(date +%s)
  run_xx "$@"
  ELAPSED=$(($(date +%s) - start))
}

# ended_promptly WHAT: the last run failed, within 60 s
ended_promptly() {
  check [ "$RC" -ne 0 ] || { fail "exit code 0 after $1"; show_run; }
  check [ "$ELAPSED" -lt 60 ] || fail "the job took ${ELAPSED} s to end after $1"
}

wait_until() {  # wait_until TENTHS COMMAND...: polls every 0.1 s; false when it never held
  local i
  for ((i = 0; i < $1; ++i)); do "${@:2}" 2>/dev/null && return 0; sleep 0.1; done
  return 1
}

gone() { ! kill -0 "$1" 2>/dev/null; }

# reap PID TENTHS WHEN: waits for a background run to end (else kills it and
# fails, saying WHEN); RC becomes its exit code.
reap() {
  wait_until "$2" gone "$1" || { fail "still running $3"; kill -KILL "$1"; }
  wait "$1"
  RC=$?
}

same_losses() {  # same_losses A B: identical step/loss lists, bit for bit
  if ! diff <(losses "$1") <(losses "$2") >"$T/loss_diff"; then
    echo "    losses differ:" >&2
    sed 's/^/    /' "$T/loss_diff" | head -10 >&2
    return 1
  fi
}

# ----------------------------------------------------------------------------
begin "nan skip: rank 2's NaN gradient skips step 3 on every rank"
base_deck "$T/nan.deck" "health every 2 nan skip" "fault nan rank 2 step 3" "run 6"
run_xx 4 -in "$T/nan.deck" -var run_dir "$T/nan"
check [ "$RC" -eq 0 ] || { fail "exit code $RC, expected 0"; show_run; }
check [ "$(occurrences 'step 3: inf or NaN in the loss or gradients of rank 2: step skipped on every rank' "$T/out")" -eq 1 ] ||
  { fail "no single skip message naming rank 2 at step 3"; show_run; }
check [ "$(occurrences 'step skipped' "$T/out")" -eq 1 ] || { fail "more than one step skipped"; show_run; }
check grep -q '"nonfinite_skipped":1' "$T/nan/metrics.jsonl" || fail "metrics.jsonl does not count the skipped step"
check grep -q 'health ok at step 6' "$T/nan/rank3/log.txt" || fail "no health report in rank 3's log"
check grep -q '"step":6' "$T/nan/metrics.jsonl" || fail "the run did not reach step 6"

begin "nan stop: one message naming rank 1, exit 3, no checkpoint of the bad state"
base_deck "$T/stop.deck" "fault nan rank 1 step 2" "run 6"
run_xx 4 -in "$T/stop.deck" -var run_dir "$T/stop"
check [ "$RC" -ne 0 ] || { fail "exit code 0 after a NaN under health nan stop"; show_run; }
check [ "$(occurrences 'xuanxue: step 2: inf or NaN in the loss or gradients of rank 1 (health nan stop' "$T/err")" -eq 1 ] ||
  { fail "expected one message naming rank 1"; show_run; }
check grep -q 'Exit code: *3' "$T/err" || { fail "expected exit code 3 from the ranks"; show_run; }
refute compgen -G "$T/stop/ckpt/step_*.h5" >/dev/null || fail "a checkpoint was written after the NaN"

begin "SIGKILL: rank 2 killed at step 3 ends the job within 60 s, named"
base_deck "$T/kill.deck" "fault kill rank 2 step 3" "run 100000"
run_timed 4 -in "$T/kill.deck" -var run_dir "$T/kill"
ended_promptly "a rank was killed"
check grep -qE 'rank 2 .*(signal 9|Killed)' "$T/err" || { fail "no message naming rank 2 and the kill"; show_run; }
check grep -q 'fault kill injected at step 3' "$T/kill/rank2/log.txt" || fail "rank 2's log does not record the fault"

begin "an exception on rank 1: logged there, the job ends through MPI_Abort naming rank and cause"
base_deck "$T/throw.deck" "fault throw rank 1 step 3" "run 100000"
run_timed 4 -in "$T/throw.deck" -var run_dir "$T/throw"
ended_promptly "a rank failed"
check grep -q 'xuanxue: rank 1 failed: fault throw injected at step 3' "$T/err" || { fail "no message naming rank 1"; show_run; }
check grep -q 'rank 1 failed at step 2: fault throw injected at step 3' "$T/throw/rank1/log.txt" ||
  fail "rank 1's log does not hold the failure"

begin "SIGTERM to rank 1 at step 4: all stop, checkpoint, exit 0; -resume auto is bit-identical"
base_deck "$T/ref.deck" "run 8"
run_xx 4 -in "$T/ref.deck" -var run_dir "$T/ref"
check [ "$RC" -eq 0 ] || { fail "reference run failed"; show_run; }
base_deck "$T/sig.deck" "fault signal rank 1 step 4" "run 8"
run_xx 4 -in "$T/sig.deck" -var run_dir "$T/sig"
check [ "$RC" -eq 0 ] || { fail "exit code $RC after SIGTERM, expected 0"; show_run; }
check [ "$(occurrences 'stopped at step 4 on SIGTERM; resume with -resume auto' "$T/out")" -eq 1 ] ||
  { fail "no single stop message"; show_run; }
check [ -f "$T/sig/ckpt/step_00000004.h5" ] || fail "no checkpoint at step 4"
refute grep -q 'step      5/8' "$T/out" || fail "a rank trained past the signal's step boundary"
run_xx 4 -in "$T/sig.deck" -var run_dir "$T/sig" -resume auto
check [ "$RC" -eq 0 ] || { fail "resume failed"; show_run; }
check same_losses "$T/ref" "$T/sig" || fail "resumed losses differ from the uninterrupted run"

# Killed at step 6: the resume starts from step 5, inside the local phase
# (ranks differ: each rank's diff is in the file), and crosses into the
# compressed phase.
begin "deepseek-tiny, SIGKILL after a checkpoint; sync local 4 in clusters, then dense with compression and feedback; diff checkpoints: resume is bit-identical"
# The model lines of input/deepseek-tiny.deck (MLA, MoE, MTP), a smaller batch.
src_deck="$(dirname "$0")/../../input/deepseek-tiny.deck"
for ((i = 1; i <= 800; ++i)); do printf 'Line %d: the quick brown fox jumps over the lazy dog, again.\n' "$i"; done >"$T/big.txt"
{
  echo "seed 1"
  grep -E '^(variable (gate|balance|seq_aux|groups|topk_groups|ep|seq) |model |attention |moe |mtp )' "$src_deck"
  echo "data bytes $T/big.txt valid 0.05 batch 2 workers 1"
  echo "peak_gflops 50"
  echo 'output dir ${run_dir} log_every 1 tensorboard off'
  echo "eval every 0 batches 1"
  echo "checkpoint every 5 mode diff codec lossless"
  echo 'fault ${fault} rank 3 step 6'
  printf '%s\n' "sync local 4 outer nesterov lr 0.7 momentum 0.9" "topology clusters 2" "run 6" \
    "sync dense" "topology full" "compress topk 0.1 feedback on momentum 0.9 transport mpi" "run 3"
} >"$T/ds.deck"
check grep -q '^attention mla' "$T/ds.deck" || fail "deepseek-tiny.deck's model lines not found"
run_xx 4 -in "$T/ds.deck" -var run_dir "$T/ds_ref" -var fault off
check [ "$RC" -eq 0 ] || { fail "reference run failed"; show_run; }
run_xx 4 -in "$T/ds.deck" -var run_dir "$T/ds_kill" -var fault kill
check [ "$RC" -ne 0 ] || { fail "the run went on after rank 3 was killed"; show_run; }
check [ -f "$T/ds_kill/ckpt/step_00000005.h5" ] || fail "no checkpoint at step 5 before the kill"
run_xx 4 -in "$T/ds.deck" -var run_dir "$T/ds_kill" -var fault kill -resume auto
check [ "$RC" -eq 0 ] || { fail "resume failed"; show_run; }
check grep -q 'step_00000005.h5' "$T/out" || { fail "did not resume from step 5"; show_run; }
check same_losses "$T/ds_ref" "$T/ds_kill" || fail "resumed losses differ from the uninterrupted run"
check [ "$(losses "$T/ds_kill" | wc -l)" -eq 9 ] || fail "expected 9 logged steps"

begin "SIGUSR1 to mpiexec: forwarded to the ranks, which stop with a checkpoint"
base_deck "$T/usr1.deck" "run 100000"
LAST_CMD="$MPIEXEC -n 2 $XX -in usr1.deck"
"$MPIEXEC" --oversubscribe --bind-to none -n 2 "$XX" -in "$T/usr1.deck" -var run_dir "$T/usr1" >"$T/out" 2>"$T/err" &
pid=$!
wait_until 600 grep -q 'step    100/' "$T/out"
kill -USR1 "$pid"
reap "$pid" 300 "30 s after SIGUSR1"
check [ "$RC" -eq 0 ] || { fail "exit code $RC after SIGUSR1, expected 0"; show_run; }
check grep -qE 'stopped at step [0-9]+ on SIGUSR1; resume with -resume auto' "$T/out" || { fail "no stop message"; show_run; }
check compgen -G "$T/usr1/ckpt/step_*.h5" >/dev/null || fail "no checkpoint after SIGUSR1"

begin "a second signal exits at once"
base_deck "$T/hang.deck" "fault hang rank 0 step 2" "run 10"
LAST_CMD="$XX -in hang.deck"
"$XX" -in "$T/hang.deck" -var run_dir "$T/hang" >"$T/out" 2>"$T/err" &
pid=$!
wait_until 600 grep -q 'fault hang injected' "$T/hang/rank0/log.txt"
kill -TERM "$pid"
sleep 0.5
kill -TERM "$pid"
reap "$pid" 50 "5 s after the second SIGTERM"
check [ "$RC" -eq 143 ] || { fail "exit code $RC, expected 143 (128 + SIGTERM)"; show_run; }
check grep -q 'second stop signal (SIGTERM): exiting now' "$T/err" || { fail "no message for the second signal"; show_run; }

finish
