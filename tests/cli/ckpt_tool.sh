#!/usr/bin/env bash
# tools/ckpt on real checkpoints: ls names every step and the latest, show
# prints the deck, verify passes intact files and fails (exit 1, naming the
# dataset) on a flipped byte, refuses a non-checkpoint with exit 2, and diff
# of a file with itself is all zero while two steps differ; with base_every,
# ls shows the chain and verify fails a delta whose base is gone.
# usage: ckpt_tool.sh XUANXUE [MPIEXEC]
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
CKPT="$(dirname "${BASH_SOURCE[0]}")/../../tools/ckpt"

CORPUS=$T/corpus.txt
RUN=$T/run
DECK=$T/deck.deck
make_corpus "$CORPUS"
make_deck "$DECK" "$CORPUS" "$RUN" 1        # a checkpoint after each of the 3 steps
begin "train 3 steps with checkpoints (setup)"
expect_ok 1 -in "$DECK"
[ "$FAILS" -eq 0 ] || finish
A=$RUN/ckpt/step_00000001.h5
B=$RUN/ckpt/step_00000003.h5

begin "ls: every step, its status, and which one latest names"
/usr/bin/python3 "$CKPT" ls "$RUN" >"$T/ls" 2>&1
check [ $? -eq 0 ] || fail "exit code $? (expected 0)"
check grep -q -E '^ +1 +step_00000001\.h5 +complete' "$T/ls" || fail "step 1 not listed as complete: $(cat "$T/ls")"
check grep -q -E '^ +3 +step_00000003\.h5 +complete .*<- latest' "$T/ls" || fail "step 3 not marked latest: $(cat "$T/ls")"

begin "show --deck prints the deck the run used"
/usr/bin/python3 "$CKPT" show --deck "$B" >"$T/deck" 2>&1
check grep -q '^model dense' "$T/deck" || fail "no model line in the deck text: $(head -3 "$T/deck")"

begin "verify: intact files pass"
check /usr/bin/python3 "$CKPT" verify "$A" "$B" >"$T/out" 2>&1 || fail "verify failed on intact files: $(cat "$T/out")"

begin "verify: a flipped byte in /model/head fails, naming it"
cp "$B" "$T/bad.h5"
read -r chunk_bytes chunk_address < <(h5ls -r -v -a "$T/bad.h5" |
  awk '$1 == "/model/head" { f = 1; next } f && $1 ~ /^0x/ { print $2, $3; exit }')
offset=$((chunk_address + chunk_bytes / 2))
byte=$(od -An -tu1 -j "$offset" -N1 "$T/bad.h5" | tr -d ' ')
printf -v hex '%02x' $((byte ^ 0xff))
printf "\\x$hex" | dd of="$T/bad.h5" bs=1 seek="$offset" conv=notrunc status=none
/usr/bin/python3 "$CKPT" verify "$T/bad.h5" >"$T/out" 2>"$T/err"
rc=$?
check [ $rc -eq 1 ] || fail "exit code $rc (expected 1)"
check grep -q "dataset '/model/head' cannot be read" "$T/err" || fail "the message does not name /model/head: $(cat "$T/err")"

begin "show lists the state registry; verify fails a file missing one of its datasets, naming it"
/usr/bin/python3 "$CKPT" show "$B" >"$T/show" 2>&1
check grep -q "state registry (.* entries): .*adam_steps (/train).*data_start (/train)" "$T/show" ||
  fail "show lists no state registry: $(grep -i state "$T/show")"
cp "$B" "$T/lost.h5"
/usr/bin/python3 -c "import h5py, sys; f = h5py.File(sys.argv[1], 'r+'); del f['train/adam_steps']" "$T/lost.h5"
/usr/bin/python3 "$CKPT" verify "$T/lost.h5" >"$T/out" 2>"$T/err"
rc=$?
check [ $rc -eq 1 ] || fail "exit code $rc (expected 1)"
check grep -q "dataset '/train/adam_steps' of the state registry is missing" "$T/err" || fail "$(cat "$T/err")"

begin "verify and show refuse a file that is not a checkpoint (exit 2)"
printf 'not hdf5' >"$T/junk.h5"
/usr/bin/python3 "$CKPT" show "$T/junk.h5" >"$T/out" 2>"$T/err"
rc=$?
check [ $rc -eq 2 ] || fail "show: exit code $rc (expected 2)"
check grep -q "$T/junk.h5: not a readable HDF5 file" "$T/err" || fail "show: $(cat "$T/err")"
/usr/bin/python3 "$CKPT" verify "$T/junk.h5" >"$T/out" 2>"$T/err"
check [ $? -eq 1 ] || fail "verify: a junk file must fail"

begin "diff: a file against itself is zero everywhere, two steps are not"
/usr/bin/python3 "$CKPT" diff "$B" "$B" >"$T/same" 2>&1
check [ "$(grep -c '^/model/' "$T/same")" -gt 5 ] || fail "too few tensors: $(cat "$T/same")"
check [ "$(grep '^/model/' "$T/same" | grep -v -c ' 0\.000e+00 ')" -eq 0 ] || fail "nonzero change against itself"
/usr/bin/python3 "$CKPT" diff "$A" "$B" >"$T/diff" 2>&1
check grep -q '^/model/head ' "$T/diff" || fail "no /model/head row"
check [ "$(grep '^/model/' "$T/diff" | grep -c ' 0\.000e+00 ')" -lt "$(grep -c '^/model/' "$T/diff")" ] ||
  fail "one step of training changed nothing"

# ----------------------------------------------------------------------------
# chains (base_every): ls shows each file's chain, verify checks the link
CRUN=$T/chain
make_deck "$T/chain.deck" "$CORPUS" "$CRUN"
sed -i 's/^run /checkpoint every 1 mode full codec lossless base_every 3 async on\nrun /' "$T/chain.deck"
sed -i 's/^variable steps 3$/variable steps 4/' "$T/chain.deck"
begin "train 4 steps with base_every 3 and async on (setup)"
expect_ok 2 -in "$T/chain.deck"
check grep -q -E 'checkpoint .*step_00000002\.h5 \(full copies, delta of step_00000001\.h5, .* in background, stall ' \
  "$T/out" || fail "no console line for the delta at step 2: $(grep checkpoint "$T/out")"
[ "$FAILS" -eq 0 ] || finish

begin "ls: each file's chain kind and base"
/usr/bin/python3 "$CKPT" ls "$CRUN" >"$T/ls" 2>&1
check grep -q -E '^ +1 +step_00000001\.h5 +complete .* base' "$T/ls" || fail "step 1 not a base: $(cat "$T/ls")"
check grep -q -E '^ +3 +step_00000003\.h5 +complete .* delta of step_00000001\.h5' "$T/ls" ||
  fail "step 3 not a delta of step 1: $(cat "$T/ls")"
check grep -q -E '^ +4 +step_00000004\.h5 +complete .* base +<- latest' "$T/ls" || fail "step 4 not a new base: $(cat "$T/ls")"

begin "verify: a delta with its base passes; without it fails naming the base"
check /usr/bin/python3 "$CKPT" verify "$CRUN"/ckpt/step_0000000[1-4].h5 >"$T/out" 2>&1 ||
  fail "verify failed on an intact chain: $(cat "$T/out")"
mkdir -p "$T/lone"
cp "$CRUN/ckpt/step_00000003.h5" "$T/lone/"
/usr/bin/python3 "$CKPT" verify "$T/lone/step_00000003.h5" >"$T/out" 2>"$T/err"
rc=$?
check [ $rc -eq 1 ] || fail "exit code $rc (expected 1)"
check grep -q "chain base 'step_00000001.h5' is missing" "$T/err" || fail "the message does not name the base: $(cat "$T/err")"

begin "export and diff rebuild a delta against its base"
/usr/bin/python3 "$CKPT" diff "$CRUN/ckpt/step_00000003.h5" "$CRUN/ckpt/step_00000003.h5" >"$T/same" 2>&1
check [ "$(grep -c '^/model/' "$T/same")" -gt 5 ] || fail "too few tensors: $(cat "$T/same")"
check [ "$(grep '^/model/' "$T/same" | grep -v -c ' 0\.000e+00 ')" -eq 0 ] || fail "nonzero change against itself"
check /usr/bin/python3 "$CKPT" export "$CRUN/ckpt/step_00000003.h5" --rank 1 -o "$T/r1.h5" >"$T/out" 2>&1 ||
  fail "export of a delta failed: $(cat "$T/out")"
check /usr/bin/python3 "$CKPT" verify "$T/r1.h5" >"$T/out" 2>&1 || fail "the export does not verify: $(cat "$T/out")"
finish
