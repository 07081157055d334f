#!/usr/bin/env bash
# TensorBoard event files (src/io/tensorboard.*) read back by an independent
# reader (tests/tensorboard_read.py: every length and data CRC, the
# file_version event, the scalars equal metrics.jsonl as float32, the
# samples as text summaries), on a
# 2-rank run and its resume; the reader catches a flipped byte; a blocked
# tb folder warns once and training goes on; `tensorboard off` writes none;
# tools/plot draws the runs and refuses a missing or bad metrics.jsonl.
# usage: tensorboard.sh XUANXUE [MPIEXEC]
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
READ="/usr/bin/python3 $HERE/../tensorboard_read.py"
PLOT="/usr/bin/python3 $HERE/../../tools/plot"

CORPUS=$T/corpus.txt
RUN=$T/run
DECK=$T/deck.deck
make_corpus "$CORPUS"
make_deck "$DECK" "$CORPUS" "$RUN" 2         # a checkpoint every 2 steps
sed -i 's/^eval every 0/eval every 2/' "$DECK"  # val_loss at steps 2 and 4
sed -i 's/^run /sample every 2 prompt "Line 1" tokens 8\nrun /' "$DECK"  # a text sample at steps 2 and 4

events_in() { find "$1" -maxdepth 1 -name 'events.out.tfevents.*' -type f | LC_ALL=C sort; }

begin "train 4 steps on 2 ranks (setup)"
expect_ok 2 -in "$DECK" -var steps 4
[ "$FAILS" -eq 0 ] || finish

begin "one events file for the run and one per rank"
mapfile -t MAIN < <(events_in "$RUN/tb")
mapfile -t R0 < <(events_in "$RUN/tb/rank0")
mapfile -t R1 < <(events_in "$RUN/tb/rank1")
check [ "${#MAIN[@]}" -eq 1 ] || fail "RUN/tb has ${#MAIN[@]} events files (expected 1)"
check [ "${#R0[@]}" -eq 1 ] || fail "RUN/tb/rank0 has ${#R0[@]} events files (expected 1)"
check [ "${#R1[@]}" -eq 1 ] || fail "RUN/tb/rank1 has ${#R1[@]} events files (expected 1)"
check grep -q -E '/events\.out\.tfevents\.[0-9]{10}\.[^/]+$' <<<"${MAIN[0]:-}" || fail "name ${MAIN[0]:-none}"
[ "$FAILS" -eq 0 ] || finish

begin "the run's scalars equal metrics.jsonl (train/ and val/ tags)"
check [ "$(grep -c '"val_loss"' "$RUN/metrics.jsonl")" -eq 2 ] || fail "expected val_loss at 2 steps in metrics.jsonl"
$READ --metrics "$RUN/metrics.jsonl" --min-scalar-events 4 --min-text-events 2 "${MAIN[0]}" >"$T/read" 2>&1
check [ $? -eq 0 ] || fail "reader: $(cat "$T/read")"
check grep -q ': OK$' "$T/read" || fail "reader: $(cat "$T/read")"
cat "$T/read"

begin "rank files: CRCs, file_version, tags under rank<r>/"
for r in 0 1; do
  f=$(events_in "$RUN/tb/rank$r")
  $READ --prefix "rank$r/" --min-scalar-events 4 "$f" >"$T/read" 2>&1
  check [ $? -eq 0 ] || fail "rank $r: $(cat "$T/read")"
done

begin "the reader catches a flipped byte in a record's data and in a length"
size=$(stat -c %s "${MAIN[0]}")
cp "${MAIN[0]}" "$T/bad_data"
printf '\xff' | dd of="$T/bad_data" bs=1 seek=$((size - 10)) conv=notrunc status=none
$READ "$T/bad_data" >"$T/read" 2>&1
rc=$?
check [ $rc -eq 1 ] || fail "exit code $rc (expected 1): $(cat "$T/read")"
check grep -q 'data CRC' "$T/read" || fail "no data CRC failure named: $(cat "$T/read")"
cp "${MAIN[0]}" "$T/bad_length"
printf '\x7f' | dd of="$T/bad_length" bs=1 seek=1 conv=notrunc status=none
$READ "$T/bad_length" >"$T/read" 2>&1
check [ $? -eq 1 ] || fail "a corrupt length passed"
check grep -q 'offset 0: length CRC' "$T/read" || fail "no length CRC failure at offset 0: $(cat "$T/read")"

begin "resume: new events files beside the old ones, all read together"
expect_ok 2 -in "$DECK" -var steps 6 -resume auto
mapfile -t MAIN < <(events_in "$RUN/tb")
check [ "${#MAIN[@]}" -eq 2 ] || fail "RUN/tb has ${#MAIN[@]} events files after the resume (expected 2)"
check [ "$(events_in "$RUN/tb/rank1" | wc -l)" -eq 2 ] || fail "RUN/tb/rank1: expected 2 events files"
$READ --metrics "$RUN/metrics.jsonl" --min-scalar-events 6 "${MAIN[@]}" >"$T/read" 2>&1
check [ $? -eq 0 ] || fail "reader after resume: $(cat "$T/read")"

begin "tensorboard off: no tb folder"
OFF=$T/off
make_deck "$T/off.deck" "$CORPUS" "$OFF"
sed -i 's/^output dir .*/& tensorboard off/' "$T/off.deck"
expect_ok 1 -in "$T/off.deck"
expect_absent "$OFF/tb" "tensorboard off"

begin "a file where RUN/tb belongs: one warning, training goes on"
BLOCKED=$T/blocked
mkdir -p "$BLOCKED" && echo "not a folder" >"$BLOCKED/tb"
make_deck "$T/blocked.deck" "$CORPUS" "$BLOCKED"
expect_ok 2 -in "$T/blocked.deck"
check [ "$(grep -c 'warning: tensorboard' "$T/out")" -eq 1 ] || fail "expected one warning on stdout: $(cat "$T/out")"
check grep -q '^PERFORMANCE' "$T/out" || fail "the run did not finish"
check grep -q 'warning: tensorboard' "$BLOCKED/rank1/log.txt" || fail "rank 1's log lacks the warning"

begin "tools/plot: two runs overlaid, four non-empty PNGs"
$PLOT "$RUN" "$OFF" -o "$T/plots" >"$T/plot" 2>"$T/plot_err"
check [ $? -eq 0 ] || fail "tools/plot failed: $(cat "$T/plot_err")"
for name in loss val_loss lr throughput; do
  png=$T/plots/$name.png
  check [ -s "$png" ] || fail "$png missing or empty"
  check [ "$(head -c 4 "$png" | od -An -tx1 | tr -d ' ')" = 89504e47 ] || fail "$png is not a PNG"
  check grep -q -x -F "$png" "$T/plot" || fail "the path $png is not printed: $(cat "$T/plot")"
done
$PLOT "$OFF" >"$T/plot" 2>&1
check [ -s "$OFF/plots/loss.png" ] || fail "one run: no RUN_DIR/plots/loss.png: $(cat "$T/plot")"

begin "tools/plot: missing or bad metrics.jsonl is exit 2 with one message"
mkdir -p "$T/empty"
$PLOT "$T/empty" >"$T/out" 2>"$T/err"
rc=$?
check [ $rc -eq 2 ] || fail "exit code $rc (expected 2)"
check [ "$(wc -l <"$T/err")" -eq 1 ] || fail "expected one line: $(cat "$T/err")"
check grep -q "^plot: $T/empty/metrics.jsonl: cannot read" "$T/err" || fail "$(cat "$T/err")"
mkdir -p "$T/bad" && printf '{"step": 1, "loss": 2.0}\n[oops\n{"step": 2, "loss": 1.9}\n' >"$T/bad/metrics.jsonl"
$PLOT "$T/bad" >"$T/out" 2>"$T/err"
rc=$?
check [ $rc -eq 2 ] || fail "exit code $rc (expected 2)"
check grep -q "^plot: $T/bad/metrics.jsonl:2: not a JSON object" "$T/err" || fail "$(cat "$T/err")"

finish
