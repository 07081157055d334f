#!/usr/bin/env bash
# tools/ckpt on real checkpoints: ls names every step and the latest, show
# prints the deck, verify passes intact files and fails (exit 1, naming the
# dataset) on a flipped byte, refuses a non-checkpoint with exit 2, and diff
# of a file with itself is all zero while two steps differ; with base_every,
# ls shows the chain and verify fails a delta whose base is gone; `writer
# rank0` writes what `writer collective` writes, and a 2-rank run stopped
# and resumed with it (-resume auto) logs the uninterrupted run's curve.
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

# ----------------------------------------------------------------------------
# writer rank0: rank 0 alone writes what the ranks wrote together
make_deck "$T/writer.deck" "$CORPUS" "\${run}"
sed -i -e 's/^variable steps 3$/variable steps 6\nvariable writer rank0\nvariable fault off/' \
  -e 's/^run /sync local 2\ncheckpoint every 2 writer ${writer}\nfault ${fault}\nrun /' "$T/writer.deck"
begin "writer rank0, 2 ranks: stopped at step 3 and resumed with -resume auto, the same curve as without the stop"
expect_ok 2 -in "$T/writer.deck" -var run "$T/w_full"
check grep -q -E 'checkpoint .*step_00000004\.h5 \(full copies, base, rank 0 writes, ' "$T/out" ||
  fail "no console line names the rank 0 writer: $(grep '^checkpoint' "$T/out")"
run_xx 2 -in "$T/writer.deck" -var run "$T/w_stop" -var fault "signal rank 1 step 3"
check [ "$RC" -eq 0 ] || { fail "the stopped run: exit code $RC (expected 0)"; show_run; }
check grep -q "stopped at step 3 on SIGTERM" "$T/out" || { fail "did not stop at step 3"; show_run; }
expect_ok 2 -in "$T/writer.deck" -var run "$T/w_stop" -resume auto
check grep -q -E "resumed from $T/w_stop/ckpt/step_00000003\.h5 at step 3 \(read and broadcast in [0-9.]+ s\)" "$T/out" ||
  fail "no 'resumed from ... at step 3 (read and broadcast in X s)' line: $(grep resumed "$T/out")"
curve "$T/w_full/metrics.jsonl" "$T/w_full.jsonl"
curve "$T/w_stop/metrics.jsonl" "$T/w_stop.jsonl"
check [ "$(wc -l <"$T/w_full.jsonl")" -eq 6 ] || fail "the uninterrupted run logged $(wc -l <"$T/w_full.jsonl") steps (expected 6)"
check cmp -s "$T/w_full.jsonl" "$T/w_stop.jsonl" || fail "the resumed curve differs from the uninterrupted one"

begin "writer rank0 and collective: the same datasets and attributes, and the files verify"
expect_ok 2 -in "$T/writer.deck" -var run "$T/w_coll" -var writer collective
for step in 2 4 6; do
  f=step_0000000$step.h5
  check /usr/bin/python3 "$CKPT" verify "$T/w_full/ckpt/$f" >"$T/verify" 2>&1 || fail "$f does not verify: $(cat "$T/verify")"
  /usr/bin/python3 - "$T/w_coll/ckpt/$f" "$T/w_full/ckpt/$f" >"$T/same" 2>&1 <<'PY'
import sys, h5py
def content(path):  # every dataset's values and every attribute, but the deck text (its writer line)
    out = {}
    with h5py.File(path, "r") as f:
        def add(name, obj):
            if isinstance(obj, h5py.Dataset): out[name] = obj[()].tobytes()
            out.update({f"{name}@{k}": repr(v) for k, v in obj.attrs.items() if k != "deck"})
        add("/", f)
        f.visititems(add)
    return out
a, b = content(sys.argv[1]), content(sys.argv[2])
differ = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
print(f"{len(a)} items; differ: {differ}")
sys.exit(1 if differ or len(a) < 50 else 0)
PY
  check [ $? -eq 0 ] || fail "$f: collective and rank0 files differ: $(cat "$T/same")"
done

# ----------------------------------------------------------------------------
# shard: each rank writes its own slabs of the tensors; no per-rank copies
make_deck "$T/shard.deck" "$CORPUS" "$T/shard" 2
sed -i 's/^run /shard gradients\nrun /' "$T/shard.deck"
begin "shard gradients, 2 ranks: each rank writes its slabs; the file verifies and exports"
expect_ok 2 -in "$T/shard.deck"
check grep -q -E 'checkpoint .*step_00000002\.h5 \(each rank its own slabs, base, collective, ' "$T/out" ||
  fail "no console line says the ranks wrote their slabs: $(grep '^checkpoint' "$T/out")"
S=$T/shard/ckpt/step_00000002.h5
check /usr/bin/python3 "$CKPT" verify "$S" >"$T/verify" 2>&1 || fail "the slab file does not verify: $(cat "$T/verify")"
check /usr/bin/python3 "$CKPT" export "$S" --rank 1 -o "$T/s1.h5" >"$T/out" 2>&1 || fail "export --rank 1 failed: $(cat "$T/out")"
/usr/bin/python3 - "$S" "$T/s1.h5" >"$T/same" 2>&1 <<'PY'
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "r") as a, h5py.File(sys.argv[2], "r") as b:
    assert a.attrs["rank_tensors"] in (b"base", "base"), "no rank_tensors = base"
    assert "params" not in a["ranks/1"], "a per-rank copy of the tensors"
    for g in ("model", "optimizer/m", "optimizer/v"):
        for name in a[g]:
            assert np.array_equal(a[g][name][()], b[g][name][()]), f"/{g}/{name} differs"
    print(len(a["model"]), "tensors equal")
PY
check [ $? -eq 0 ] || fail "rank 1's export is not the base: $(cat "$T/same")"
finish
