#!/usr/bin/env bash
# jobs/mpirun.sh's exit status (README.md, "Exit codes"), 2 ranks:
#   - SIGTERM to the script mid-run: every rank stops at a step boundary with
#     a checkpoint, and the script exits 0 (mpirun itself exits 1 after a
#     TERM of its own); RUN_DIR/stopped.json names the step, the signal and
#     the checkpoint, which verifies; a resumed run that ends normally
#     removes it; no marker file is left in the working directory;
#   - SIGINT (a terminal's Ctrl-C) the same;
#   - an exception on rank 1 (`fault throw`): exit 1, no marker;
#   - a second SIGTERM while the stop cannot finish (rank 0 hangs): 143;
#   - the script SIGKILLed (a timeout): mpirun and the ranks end as well;
#   - a bad deck: 2; a NaN under `health nan stop`: 3.
# usage: launcher.sh XUANXUE [MPIEXEC]
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
LAUNCH=$REPO/jobs/mpirun.sh
CKPT_TOOL=$REPO/tools/ckpt
export XUANXUE=$XX
cd "$T" || exit 1  # the script's stop marker goes to the working directory

make_corpus "$T/corpus.txt"
deck() {  # deck PATH LINES...: the tiny model, logging every step, then LINES
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

# launch RUN_DIR ARGS...: jobs/mpirun.sh 2 ARGS in the background; PID.
# With job control (set -m), as a terminal's shell runs it: without, bash
# starts a background command with SIGINT ignored, and it could never trap it.
launch() {
  local run=$1
  shift
  LAST_CMD="jobs/mpirun.sh 2 $* -var run_dir $run"
  set -m
  "$LAUNCH" 2 "$@" -var run_dir "$run" >"$T/out" 2>"$T/err" </dev/null &
  PID=$!
  set +m
}

wait_until() {  # wait_until TENTHS COMMAND...: polls every 0.1 s; false when it never held
  local i
  for ((i = 0; i < $1; ++i)); do "${@:2}" 2>/dev/null && return 0; sleep 0.1; done
  return 1
}

reap() {  # reap TENTHS WHEN: waits for $PID (else kills it and fails); RC its exit status
  local i
  for ((i = 0; i < $1; ++i)); do kill -0 "$PID" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$PID" 2>/dev/null; then
    fail "still running $2"
    kill -KILL "$PID"
  fi
  wait "$PID"
  RC=$?
}

json_field() {  # json_field FILE KEY
  /usr/bin/python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$1" "$2"
}

no_marker_left() {
  check [ -z "$(compgen -G "$T/.xuanxue-stop.*")" ] || fail "marker files left in the working directory: $(ls -a "$T")"
}

deck "$T/long.deck" 'run ${steps}'

for sig in TERM INT; do
  begin "SIG$sig to jobs/mpirun.sh mid-run: a checkpoint, exit 0"
  run=$T/run_$sig
  launch "$run" "$T/long.deck" -var steps 100000
  wait_until 600 grep -q 'step     50/' "$T/out" || fail "the run never reached step 50"
  kill -s "$sig" "$PID"
  reap 600 "60 s after SIG$sig"
  check [ "$RC" -eq 0 ] || { fail "exit code $RC after SIG$sig (expected 0)"; show_run; }
  step=$(sed -n 's/^stopped at step \([0-9]*\) on SIGUSR1; resume with -resume auto$/\1/p' "$T/out")
  check [ -n "$step" ] || { fail "no 'stopped at step N on SIGUSR1' line"; show_run; }
  [ -n "$step" ] || continue
  ckpt=$run/ckpt/$(printf 'step_%08d.h5' "$step")
  check [ -f "$ckpt" ] || fail "no checkpoint at the stop's step $step"
  check /usr/bin/python3 "$CKPT_TOOL" verify "$ckpt" >/dev/null 2>&1 || fail "$ckpt does not verify"
  check [ "$(json_field "$run/stopped.json" step 2>/dev/null)" = "$step" ] || fail "stopped.json lacks step $step"
  check [ "$(json_field "$run/stopped.json" checkpoint 2>/dev/null)" = "$ckpt" ] || fail "stopped.json lacks $ckpt"
  check [ "$(json_field "$run/stopped.json" signal 2>/dev/null)" = SIGUSR1 ] || fail "stopped.json lacks the signal"
  no_marker_left
done

begin "a resumed run that ends normally: exit 0, the stop marker removed"
if [ -n "${step:-}" ]; then
  launch "$T/run_INT" "$T/long.deck" -var steps $((step + 2)) -resume auto
  reap 600 "60 s after the start of a 2-step resume"
  check [ "$RC" -eq 0 ] || { fail "exit code $RC (expected 0)"; show_run; }
  check [ ! -e "$T/run_INT/stopped.json" ] || fail "stopped.json is still there after a run that was not stopped"
  no_marker_left
fi

begin "an exception on rank 1 through jobs/mpirun.sh: exit 1"
deck "$T/throw.deck" "fault throw rank 1 step 3" "run 100"
launch "$T/run_throw" "$T/throw.deck"
reap 600 "60 s after the start"
check [ "$RC" -eq 1 ] || { fail "exit code $RC (expected 1: a rank failed)"; show_run; }
check grep -q 'xuanxue: rank 1 failed: fault throw injected at step 3' "$T/err" || { fail "no message naming rank 1"; show_run; }
check [ ! -e "$T/run_throw/stopped.json" ] || fail "a stop marker after a failure"
no_marker_left

begin "a second SIGTERM while rank 0 hangs: the stop is cut short, 143"
deck "$T/hang.deck" "fault hang rank 0 step 3" "run 100"
launch "$T/run_hang" "$T/hang.deck"
wait_until 600 grep -q 'fault hang injected' "$T/run_hang/rank0/log.txt" || fail "rank 0 never hung"
kill -TERM "$PID"
sleep 0.5
kill -TERM "$PID"
reap 300 "30 s after the second SIGTERM"
check [ "$RC" -eq 143 ] || { fail "exit code $RC (expected 143 = 128 + SIGTERM)"; show_run; }
check grep -q 'second stop signal (SIGTERM): exiting now' "$T/err" || { fail "no message for the second signal"; show_run; }
check [ ! -e "$T/run_hang/stopped.json" ] || fail "a stop marker without a stop checkpoint"
no_marker_left

begin "SIGKILL of jobs/mpirun.sh (a timeout): mpirun and the ranks end too"
launch "$T/run_kill" "$T/long.deck" -var steps 100000
wait_until 600 grep -q 'step     50/' "$T/out" || fail "the run never reached step 50"
kill -KILL "$PID"
wait "$PID" 2>/dev/null
# the job's processes are the ones with this run directory on their command line
running() { pgrep -f -- "-var run_dir $T/run_kill" >/dev/null; }
check wait_until 300 eval '! running' || {
  fail "mpirun or a rank still runs 30 s after the script was killed"
  for p in $(pgrep -f -- "-var run_dir $T/run_kill"); do kill -KILL "$p"; done
}
# (mpirun's TERM may still let the ranks stop cleanly; the marker rank 0 then
# writes has no script left to remove it)
rm -f "$T"/.xuanxue-stop.*

begin "bad input through jobs/mpirun.sh: 2; a NaN under health nan stop: 3"
deck "$T/bad.deck" "run 3" "sed 1"
launch "$T/run_bad" "$T/bad.deck"
reap 600 "60 s after the start"
check [ "$RC" -eq 2 ] || { fail "bad deck: exit code $RC (expected 2)"; show_run; }
deck "$T/nan.deck" "fault nan rank 1 step 2" "run 6"
launch "$T/run_nan" "$T/nan.deck"
reap 600 "60 s after the start"
check [ "$RC" -eq 3 ] || { fail "NaN: exit code $RC (expected 3)"; show_run; }
no_marker_left

finish
