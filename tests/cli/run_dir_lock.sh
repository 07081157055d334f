#!/usr/bin/env bash
# One job per run directory (docs/RESILIENCE.md, src/io/run_dir_lock.h), on
# input/tiny.deck:
#   - a first run (1 rank, in the background, long enough) takes RUN_DIR/.lock;
#   - a second run on the same run dir (2 ranks) exits 2 with one line naming
#     the first's host and pid and the lock file, and trains nothing;
#   - the first finishes with exit 0, its checkpoint and metrics intact (every
#     step logged once, the last checkpoint at its last step);
#   - -dry-run on the busy dir takes no lock (exit 0);
#   - a third run after the first ended resumes from its checkpoint (-resume
#     auto) and succeeds: the stale .lock file blocks nothing.
# usage: run_dir_lock.sh XUANXUE [MPIEXEC]
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT" || exit 1

RUN=$T/run
STEPS=${XX_LOCK_STEPS:-300}
COMMON=(-in input/tiny.deck -var run_dir "$RUN" -var log_every 1 -var eval_every 0 -var ckpt_every 50)

wait_until() {  # wait_until TENTHS COMMAND...: polls every 0.1 s; false when it never held
  local i
  for ((i = 0; i < $1; ++i)); do "${@:2}" 2>/dev/null && return 0; sleep 0.1; done
  return 1
}
has_pid() { grep -q '^pid [0-9]' "$RUN/.lock"; }
gone() { ! kill -0 "$1" 2>/dev/null; }

begin "a second job on a busy run directory exits 2, naming the first"
"$XX" "${COMMON[@]}" -var steps "$STEPS" >"$T/first.out" 2>"$T/first.err" &
FIRST=$!
check wait_until 600 has_pid || fail "no $RUN/.lock with a pid after 60 s"
run_xx 2 "${COMMON[@]}" -var steps "$STEPS"
msg="xuanxue: $RUN is in use by another job (host $(hostname), pid $FIRST, started "
before=$FAILS
check [ "$RC" -eq 2 ] || fail "exit code $RC (expected 2)"
check [ "$(lines_starting_with "$msg" "$T/err")" -eq 1 ] || fail "no single stderr line starting with '$msg'"
check grep -q -F -- "; its lock $RUN/.lock); expected one job per run directory" "$T/err" ||
  fail "the message lacks the lock path and the expectation"
check [ "$(occurrences "in use by another job" "$T/err")" -eq 1 ] || fail "the message is not printed once"
refute grep -q -E -- "$crash_pattern" "$T/err" "$T/out" || fail "crash or rank failure"
refute grep -q -E -- '^step +[0-9]|^PERFORMANCE' "$T/out" || fail "the second job trained"
check kill -0 "$FIRST" || fail "the first run ended before the second was refused (make it longer: XX_LOCK_STEPS)"
[ "$FAILS" -eq "$before" ] || show_run

begin "-dry-run takes no lock"
run_xx 1 "${COMMON[@]}" -var steps "$STEPS" -dry-run
check [ "$RC" -eq 0 ] || { fail "exit code $RC (expected 0)"; show_run; }

begin "the first run finishes, its checkpoint and metrics intact"
wait_until 3000 gone "$FIRST" || { fail "the first run still runs after 300 s"; kill -KILL "$FIRST"; }
wait "$FIRST"
RC=$?
check [ "$RC" -eq 0 ] || { fail "first run: exit code $RC"; sed 's/^/    first| /' "$T/first.err" | head -20 >&2; }
steps_logged=$(/usr/bin/python3 - "$RUN/metrics.jsonl" <<'PY'
import json, sys
steps = [json.loads(l)["step"] for l in open(sys.argv[1]) if '"loss"' in l]
print(len(steps), len(set(steps)), max(steps))
PY
)
check [ "$steps_logged" = "$STEPS $STEPS $STEPS" ] ||
  fail "metrics.jsonl: (records, distinct steps, last step) = $steps_logged, expected $STEPS each"
check [ ! -e "$RUN/metrics.jsonl.1" ] || fail "the second job rotated the first's metrics"
latest=$(cat "$RUN/ckpt/latest" 2>/dev/null)
check [ -n "$latest" ] && check [ -e "$RUN/ckpt/$latest" ] || fail "no checkpoint under $RUN/ckpt (latest '$latest')"
check grep -q -- "$STEPS" <<<"$latest" || fail "the latest checkpoint '$latest' is not at step $STEPS"
check [ -e "$RUN/.lock" ] || fail "the lock file is gone (it stays, unlocked)"

begin "a resume refused as bad input leaves the run directory's lock file where it was"
run_xx 1 "${COMMON[@]}" -var steps "$STEPS" -resume "$T/no-such-checkpoint.h5"
check [ "$RC" -eq 2 ] || { fail "exit code $RC (expected 2)"; show_run; }
check [ -e "$RUN/.lock" ] || fail "the refused resume removed $RUN/.lock (it did not create it)"

begin "a third run after the first ended resumes and succeeds"
expect_ok 1 "${COMMON[@]}" -var steps $((STEPS + 5)) -resume auto
check grep -q -i "resum" "$T/out" "$T/err" || { fail "the third run did not resume"; show_run; }

finish
