#!/usr/bin/env bash
# A hung rank is named: 4 ranks train a tiny deck with `timeout 5` and
# `fault hang rank 2 step 4` (rank 2 sleeps forever before step 4's first
# collective). The watchdogs must end the job well within 60 s with a nonzero
# exit, every rank must dump RUN_DIR/rank<r>/flight.json, rank 2's own
# watchdog must say it is stuck outside MPI, and tools/flight must name rank 2
# as the one that never entered collective #k while ranks 0,1,3 waited in it.
# Also: tools/flight's bad input, a rank without a dump, and the dump of a
# rank that fails with an exception (`fault throw`).
# usage: hang.sh XUANXUE [MPIEXEC]
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
FLIGHT="$(dirname "${BASH_SOURCE[0]}")/../../tools/flight"
RUN_TIMEOUT=60  # the test's limit: a watchdog that does not fire fails it

CORPUS=$T/corpus.txt
RUN=$T/run
DECK=$T/deck.deck
make_corpus "$CORPUS"
make_deck "$DECK" "$CORPUS" "$RUN"
sed -i 's/^variable steps 3$/variable steps 8/' "$DECK"
sed -i 's/^run \${steps}$/timeout 5\nfault hang rank 2 step 4\nrun ${steps}/' "$DECK"

begin "4 ranks, rank 2 hangs at step 4: the watchdog ends the job"
start=$(date +%s.%N)
run_xx 4 -in "$DECK"
seconds=$(echo "$(date +%s.%N) - $start" | bc)
echo "    job ended after ${seconds} s with exit code $RC"
check [ "$RC" -ne 124 ] || { fail "still running after ${RUN_TIMEOUT} s"; show_run; finish; }
check [ "$RC" -ne 0 ] || { fail "exit code 0 (expected the watchdog's abort)"; show_run; }
check grep -q -E '^step +3/8 \| loss' "$RUN/rank0/log.txt" || { fail "the run did not train up to the hang"; show_run; }
refute grep -q -E '^step +4/8 \| loss' "$RUN/rank0/log.txt" || fail "step 4 finished although rank 2 hung in it"
check grep -q -E "^xuanxue: rank 2: watchdog: no collective started or finished for [0-9.]+ s since .* this rank is stuck outside MPI" "$T/err" ||
  { fail "rank 2 did not name itself"; show_run; }
check grep -q -E "^xuanxue: rank 0: watchdog: MPI_[A-Za-z]+ #[0-9]+ on world not finished after [0-9.]+ s \(flight recorder: $RUN/rank0/flight.json\)" "$T/err" ||
  { fail "rank 0 did not report the collective it waited in"; show_run; }
check grep -q "rank 2: watchdog" "$RUN/rank2/log.txt" || fail "rank 2's log lacks the watchdog line"

begin "every rank dumped its flight recorder"
for r in 0 1 2 3; do
  check [ -s "$RUN/rank$r/flight.json" ] || fail "no $RUN/rank$r/flight.json"
done
refute ls "$RUN"/rank*/flight.json.tmp* >/dev/null 2>&1 || fail "a temp file was left behind"

begin "tools/flight names rank 2 as the one that never entered collective #k"
/usr/bin/python3 "$FLIGHT" "$RUN" >"$T/flight" 2>&1
rc=$?
sed 's/^/    | /' "$T/flight"
check [ $rc -eq 0 ] || fail "tools/flight: exit code $rc (expected 0)"
check grep -q -E '^rank 2 never entered collective #[0-9]+ \(MPI_[A-Za-z]+ on world, [0-9]+ B\); ranks 0,1,3 waited [0-9.]+ s$' "$T/flight" ||
  fail "no verdict naming rank 2"
# k is one past rank 2's last call on world, and the collective the others report.
k=$(sed -n -E 's/^rank 2 never entered collective #([0-9]+).*/\1/p' "$T/flight")
check grep -q "rank 0: watchdog: MPI_[A-Za-z]* #$k on world" "$T/err" || fail "rank 0 waited in another call than #$k"

begin "tools/flight: bad input ends with exit 2 and one message"
/usr/bin/python3 "$FLIGHT" "$T/nowhere" >"$T/out" 2>"$T/err"
check [ $? -eq 2 ] || fail "missing directory: exit code not 2"
check grep -q "$T/nowhere: not a directory" "$T/err" || fail "missing directory: $(cat "$T/err")"
printf '{"rank": 1, "world": ' >"$RUN/rank1/flight.json"
/usr/bin/python3 "$FLIGHT" "$RUN" >"$T/out" 2>"$T/err"
check [ $? -eq 2 ] || fail "truncated dump: exit code not 2"
check grep -q "$RUN/rank1/flight.json: not valid JSON" "$T/err" || fail "truncated dump: $(cat "$T/err")"

begin "tools/flight: a rank without a dump is named"
rm "$RUN/rank1/flight.json"
/usr/bin/python3 "$FLIGHT" "$RUN" >"$T/flight" 2>&1
check grep -q '^rank 1: no flight.json' "$T/flight" || fail "rank 1 not listed as missing: $(cat "$T/flight")"
check grep -q 'no dump from rank(s) 1: died, hung or were ended by the abort before dumping' "$T/flight" || fail "no note about rank 1"
check grep -q '^rank 2 never entered collective' "$T/flight" || fail "the verdict changed: $(cat "$T/flight")"

begin "an exception on rank 1: it dumps before its MPI_Abort, and tools/flight names it"
sed -e 's/^fault hang rank 2 step 4$/fault throw rank 1 step 3/' -e 's/^timeout 5$/timeout 30/' \
  -e "s|^output dir $RUN |output dir $T/throw |" "$DECK" >"$T/throw.deck"
run_xx 4 -in "$T/throw.deck"
check [ "$RC" -ne 0 ] || { fail "exit code 0 after a rank failed"; show_run; }
check [ -s "$T/throw/rank1/flight.json" ] || { fail "rank 1 did not dump its flight recorder"; show_run; }
/usr/bin/python3 "$FLIGHT" "$T/throw" >"$T/flight" 2>&1
check grep -q '^rank 1 ended the job: exception: fault throw injected at step 3$' "$T/flight" ||
  fail "tools/flight does not name rank 1: $(cat "$T/flight")"

finish
