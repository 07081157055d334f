# Shared by the command-line tests of bad input (tests/cli/*.sh): arguments,
# a temp dir, a tiny corpus and deck, runs of the real binary at 1 or N ranks,
# and the assertions that make up the project's rule for bad input:
#   exit code exactly 2; one message (not one per rank) that starts with the
#   file and the line, key or offset; the "expected" hint; no crash; and
#   nothing written where it should not be.
#
# usage (from a test script): source lib.sh XUANXUE [MPIEXEC]
set -u

XX=${1:?usage: $0 XUANXUE [MPIEXEC]}
# The binary under test is also the deck reader of the Python tools (tools/xxpy/deck.py).
XUANXUE_BIN=$(realpath "$XX") && export XUANXUE_BIN
MPIEXEC=${2:-mpiexec}
: "${OPENBLAS_NUM_THREADS:=1}"
export OPENBLAS_NUM_THREADS
RUN_TIMEOUT=${XX_CLI_TIMEOUT:-120}  # seconds per run of the binary; a hang is a failure

T=$(mktemp -d "${TMPDIR:-/tmp}/xx-cli.XXXXXX") || exit 1
trap 'rm -rf "$T"' EXIT
CASE=setup
CHECKS=0
FAILS=0

# ----------------------------------------------------------------------------
# reporting

begin() {
  CASE=$1
  echo "--- [${SECONDS} s] $CASE"
}

fail() {
  echo "FAIL [$CASE]: $*" >&2
  FAILS=$((FAILS + 1))
}

check() {  # check COMMAND...: counts a check; true when COMMAND succeeds
  CHECKS=$((CHECKS + 1))
  "$@"
}

refute() {  # refute COMMAND...: counts a check; true when COMMAND fails
  CHECKS=$((CHECKS + 1))
  ! "$@"
}

show_run() {  # the last run's output, indented, after a failure
  echo "    command: ${LAST_CMD}" >&2
  echo "    exit code: ${RC}" >&2
  sed -n '1,40s/^/    stderr| /p' "$T/err" >&2
  sed -n '1,10s/^/    stdout| /p' "$T/out" >&2
}

finish() {
  echo "=== $CHECKS checks, $FAILS failure(s) in ${SECONDS} s"
  [ "$FAILS" -eq 0 ] && exit 0
  exit 1
}

# ----------------------------------------------------------------------------
# fixtures

# A few KB of text: enough windows of 16 tokens for a 3-step run.
make_corpus() {  # make_corpus PATH
  local i
  for ((i = 1; i <= 150; ++i)); do
    printf 'Line %d: the quick brown fox jumps over the lazy dog, again.\n' "$i"
  done >"$1"
}

# The base deck. Line numbers matter: the tests check them.
#   1 comment           5-6 model (continued)    9  output
#   2 variable steps    7   data                 10 eval
#   3 (blank)           8   peak_gflops          11 run ${steps}
#   4 seed
make_deck() {  # make_deck PATH CORPUS RUN_DIR [CHECKPOINT_EVERY]
  cat >"$1" <<EOF
# cli test deck: a tiny dense model on a few KB of text
variable steps 3

seed 1
model dense vocab 256 dim 32 layers 1 &
      heads 2 ffn 64 seq 16   # continued from the line above
data bytes $2 valid 0.1 batch 2 workers 1
peak_gflops 50
output dir $3 log_every 1
eval every 0 batches 1
run \${steps}
EOF
  if [ $# -ge 4 ]; then
    sed -i "10a checkpoint every $4" "$1"
  fi
}

# The curve of a run: its metrics.jsonl without the timings, one sorted JSON
# object per line, from step AFTER+1 on (default: every step).
curve() {  # curve METRICS OUT [AFTER]
  /usr/bin/python3 - "$1" "$2" "${3:-0}" <<'PY'
import json, sys
timings = {"ms_per_step", "tokens_per_s", "mfu", "comm_s"}
with open(sys.argv[1]) as f, open(sys.argv[2], "w") as out:
    for line in f:
        rec = {k: v for k, v in json.loads(line).items() if k not in timings}
        if rec["step"] > int(sys.argv[3]): out.write(json.dumps(rec, sort_keys=True) + "\n")
PY
}

# A manifest of everything under DIR: one line per directory, a checksum per file;
# not ./.lock, which names the last job that held the run directory (docs/RESILIENCE.md).
snapshot() {  # snapshot DIR
  (cd "$1" && find . -path ./.lock -prune -o -print | LC_ALL=C sort | while IFS= read -r p; do
    if [ -f "$p" ]; then sha256sum "$p"; else echo "dir $p"; fi
  done)
}

# ----------------------------------------------------------------------------
# running the binary

# run_xx NP ARGS...: runs xuanxue on NP ranks (1: directly, no mpiexec);
# sets RC, leaves stdout in $T/out and stderr in $T/err.
run_xx() {
  local np=$1
  shift
  if [ "$np" -eq 1 ]; then
    LAST_CMD="$XX $*"
    timeout "$RUN_TIMEOUT" "$XX" "$@" >"$T/out" 2>"$T/err"
  else
    LAST_CMD="$MPIEXEC --oversubscribe --bind-to none -n $np $XX $*"
    timeout "$RUN_TIMEOUT" "$MPIEXEC" --oversubscribe --bind-to none -n "$np" "$XX" "$@" >"$T/out" 2>"$T/err"
  fi
  RC=$?
  [ "$RC" -eq 124 ] && echo "    (timed out after ${RUN_TIMEOUT} s)" >>"$T/err"
}

occurrences() {  # occurrences STRING FILE: how often STRING appears (not lines)
  grep -o -F -- "$1" "$2" | wc -l
}

lines_starting_with() {  # lines_starting_with PREFIX FILE
  awk -v s="$1" 'index($0, s) == 1 { n++ } END { print n + 0 }' "$2"
}

# Signs that the process crashed or took the rank-failure path (exit 1,
# MPI_Abort) instead of the bad-input path.
crash_pattern='Segmentation|segmentation fault|terminate called|MPI_ABORT|core dumped|Aborted|signal [0-9]+|rank [0-9]+ failed|what\(\):'

# expect_bad NP PREFIX [HINT...] -- ARGS...
# Runs xuanxue on NP ranks with ARGS and asserts the bad-input contract:
#   - exit code exactly 2;
#   - PREFIX (e.g. "deck:4: unknown command 'sed'") occurs exactly once in
#     stderr, at the start of a line: one message, not one per rank;
#   - every HINT (e.g. "(did you mean 'seed'?)") occurs in stderr;
#   - no crash, no rank failure, no training step on stdout.
# split_hints HINT... -- ARGS...: HINTS=(the hints), ARGS=(what follows the --).
split_hints() {
  HINTS=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do
    HINTS+=("$1")
    shift
  done
  shift  # the --
  ARGS=("$@")
}

expect_bad() {
  local np=$1 prefix=$2 h
  shift 2
  split_hints "$@"
  local hints=("${HINTS[@]}")
  run_xx "$np" "${ARGS[@]}"
  local before=$FAILS
  check [ "$RC" -eq 2 ] || fail "np $np: exit code $RC (expected 2)"
  local n s
  n=$(occurrences "$prefix" "$T/err")
  s=$(lines_starting_with "$prefix" "$T/err")
  check [ "$n" -eq 1 ] || fail "np $np: '$prefix' appears $n times in stderr (expected once)"
  check [ "$s" -eq 1 ] || fail "np $np: no stderr line starts with '$prefix'"
  for h in "${hints[@]}"; do
    check grep -q -F -- "$h" "$T/err" || fail "np $np: stderr lacks the hint '$h'"
  done
  refute grep -q -E -- "$crash_pattern" "$T/err" "$T/out" || fail "np $np: crash or rank failure in the output"
  refute grep -q -E -- '^step +[0-9]|^PERFORMANCE' "$T/out" || fail "np $np: it trained (expected to stop before the first step)"
  [ "$FAILS" -eq "$before" ] || show_run
}

# expect_ok NP ARGS...: a run that must succeed (positive controls).
expect_ok() {
  local np=$1
  shift
  run_xx "$np" "$@"
  check [ "$RC" -eq 0 ] || { fail "np $np: exit code $RC (expected 0)"; show_run; }
}

expect_absent() {  # expect_absent PATH WHY
  check [ ! -e "$1" ] || fail "$1 exists ($2)"
}

# term_mid_case CONSOLE WHILE_RUNNING CMD...: runs CMD in the background
# (stdout $T/out, stderr $T/err) until CONSOLE has a step line, calls
# WHILE_RUNNING (a function that looks at what the run has set up; $PID is
# the run's), sends SIGTERM and waits; the run must end with exit 130.
term_mid_case() {
  local console=$1 while_running=$2 i
  shift 2
  "$@" >"$T/out" 2>"$T/err" &
  PID=$!
  for ((i = 0; i < 120; ++i)); do
    grep -q "^step" "$console" 2>/dev/null && break
    sleep 0.5
  done
  "$while_running"
  kill -TERM "$PID"
  wait "$PID"
  RC=$?
  check [ "$RC" -eq 130 ] || { fail "exit status $RC, expected 130"; show_run; }
}
