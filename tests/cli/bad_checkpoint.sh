#!/usr/bin/env bash
# Bad checkpoints given to -resume: exit code 2, one message naming the file
# (and the tensor where one is at fault), at 1 and 2 ranks; and nothing
# already written is lost: after each failed resume every file of the run
# directory (metrics.jsonl, rank logs, ckpt/*.h5, ckpt/latest) is
# byte-for-byte what it was, and no file was added. A delta (base_every)
# without its chain base is refused the same way.
# usage: bad_checkpoint.sh XUANXUE [MPIEXEC]
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CORPUS=$T/corpus.txt
RUN=$T/run
DECK=$T/deck.deck
make_corpus "$CORPUS"
make_deck "$DECK" "$CORPUS" "$RUN" 2        # checkpoint every 2
sed -i -e 's/^variable steps 3$/variable steps 5/' \
  -e "s#^output dir [^ ]*#variable run $RUN\noutput dir \${run}#" "$DECK"
sed -e 's/ dim 32 / dim 16 /' "$DECK" >"$T/dim16.deck"
CK=$RUN/ckpt/step_00000005.h5               # the newest checkpoint
KEEP=$T/keep                                # pristine copies, outside the run

begin "train 5 steps with checkpoints (setup)"
expect_ok 1 -in "$DECK"
for f in metrics.jsonl rank0/log.txt ckpt/latest ckpt/step_00000002.h5 ckpt/step_00000004.h5 ckpt/step_00000005.h5; do
  check [ -s "$RUN/$f" ] || fail "the setup run did not write $f"
done
[ "$FAILS" -eq 0 ] || finish
mkdir -p "$KEEP"
cp -p "$CK" "$KEEP/step_00000005.h5"

restore_newest() { cp -p "$KEEP/step_00000005.h5" "$CK"; }

# after_failed_resume NAME: the run directory equals the snapshot taken before.
BEFORE=$T/before.txt
take_snapshot() { snapshot "$RUN" >"$BEFORE"; }
expect_unchanged() {
  snapshot "$RUN" >"$T/after.txt"
  check cmp -s "$BEFORE" "$T/after.txt" || {
    fail "$1: a failed resume changed the run directory (expected nothing already written to change)"
    diff "$BEFORE" "$T/after.txt" | sed 's/^/    /' >&2
  }
}

# bad_resume NPS PREFIX [HINT...] -- ARGS...: fails as bad input at each of
# NPS ranks and leaves the run directory as it was.
bad_resume() {
  local nps=$1 np
  shift
  take_snapshot
  for np in $nps; do
    expect_bad "$np" "$@"
    expect_unchanged "np $np"
  done
}

# ----------------------------------------------------------------------------
# (a) a flipped byte inside a tensor's data: fletcher32 catches it.
begin "checksum failure in the newest checkpoint, -resume PATH and -resume auto"
# Where /model/head's one chunk lies, from h5ls; without h5ls, 60% into the
# file, which holds tensor data too (then the tensor's name is not checked).
size=$(stat -c %s "$CK")
offset=$((size * 6 / 10))
tensor="/"
if command -v h5ls >/dev/null; then
  read -r chunk_bytes chunk_address < <(h5ls -r -v -a "$CK" |
    awk '$1 == "/model/head" { f = 1; next } f && $1 ~ /^0x/ { print $2, $3; exit }')
  if [ -n "${chunk_address:-}" ]; then
    offset=$((chunk_address + chunk_bytes / 2))
    tensor="/model/head'"
  fi
fi
byte=$(od -An -tu1 -j "$offset" -N1 "$CK" | tr -d ' ')
printf -v hex '%02x' $((byte ^ 0xff))
printf "\\x$hex" | dd of="$CK" bs=1 seek="$offset" conv=notrunc status=none
check [ "$(cmp -l "$KEEP/step_00000005.h5" "$CK" | wc -l)" -eq 1 ] || fail "the corruption did not change exactly one byte"
echo "    flipped the byte at offset $offset of $size"
bad_resume "1 2" "$CK: tensor '$tensor" "cannot be read" "(checksum mismatch or corrupt data)" -- -in "$DECK" -resume "$CK"
# auto trusts the `complete` attribute, finds this file, and must fail alike.
bad_resume "1 2" "$CK: tensor '$tensor" "(checksum mismatch or corrupt data)" -- -in "$DECK" -resume auto
restore_newest

# (a2) data that passes fletcher32 but not its crc32c: the attribute of
# /model/head changed (h5py), and a missing rank of the per-rank state.
if /usr/bin/python3 -c "import h5py" 2>/dev/null; then
  begin "crc32c mismatch in the newest checkpoint, -resume PATH"
  /usr/bin/python3 -c "import h5py, sys; f = h5py.File(sys.argv[1], 'r+'); a = f['model/head'].attrs; a['crc32c'] = a['crc32c'] ^ 1" "$CK"
  bad_resume "1 2" "$CK: dataset '/model/head' fails its checksum" "expected" -- -in "$DECK" -resume "$CK"
  restore_newest

  begin "per-rank state of rank 0 missing, -resume PATH"
  /usr/bin/python3 -c "import h5py, sys; f = h5py.File(sys.argv[1], 'r+'); del f['ranks/0']" "$CK"
  bad_resume "1 2" "$CK: group '/ranks/0' is missing" "(expected the state of rank 0)" -- -in "$DECK" -resume "$CK"
  restore_newest
fi

# ----------------------------------------------------------------------------
# (b) truncated files.
begin "truncated checkpoint, -resume PATH"
head -c $((size / 2)) "$KEEP/step_00000005.h5" >"$CK"
bad_resume "1 2" "$CK: cannot open" "(corrupt or truncated HDF5 file)" -- -in "$DECK" -resume "$CK"
restore_newest

begin "checkpoint cut to its first 1000 bytes, -resume PATH"
head -c 1000 "$KEEP/step_00000005.h5" >"$CK"
bad_resume "1" "$CK: cannot open" "(corrupt or truncated HDF5 file)" -- -in "$DECK" -resume "$CK"
restore_newest

begin "empty checkpoint file, -resume PATH"
: >"$CK"
bad_resume "1 2" "$CK: not an HDF5 file" "(expected a xuanxue checkpoint)" -- -in "$DECK" -resume "$CK"
restore_newest

# ----------------------------------------------------------------------------
# (c) a deck whose model differs from the checkpoint's.
begin "resume with a different dim"
bad_resume "1 2" "$CK: tensor '/model/embed' has shape [256, 32]" "(expected [256, 16] from the deck's model)" \
  -- -in "$T/dim16.deck" -resume "$CK"
bad_resume "1" "$CK: tensor '/model/embed' has shape [256, 32]" "(expected [256, 16] from the deck's model)" \
  -- -in "$T/dim16.deck" -resume auto

# ----------------------------------------------------------------------------
# (d) paths that are not checkpoints.
begin "resume from a path that does not exist"
bad_resume "1 2" "$T/nonexistent.h5: no such checkpoint" "(given to -resume)" -- -in "$DECK" -resume "$T/nonexistent.h5"

begin "resume from a text file"
bad_resume "1" "$DECK: not an HDF5 file" "(expected a xuanxue checkpoint)" -- -in "$DECK" -resume "$DECK"

begin "resume from a directory"
bad_resume "1" "$RUN/ckpt: not an HDF5 file" "(expected a xuanxue checkpoint)" -- -in "$DECK" -resume "$RUN/ckpt"

# ----------------------------------------------------------------------------
# (e) the run directory is as the setup run left it: compare with the pristine
# checkpoint once more, in case restore_newest hid a change to it.
begin "the newest checkpoint is intact after all failed resumes"
check cmp -s "$KEEP/step_00000005.h5" "$CK" || fail "$CK differs from the copy taken after the setup run"

# ----------------------------------------------------------------------------
# (f) a delta (base_every) whose chain base is gone: refused as a whole.
begin "a delta checkpoint without its chain base"
CRUN=$T/chain
sed -e "s#^checkpoint every 2#checkpoint every 2 mode diff base_every 3#" "$DECK" >"$T/chain.deck"
expect_ok 1 -in "$T/chain.deck" -var run "$CRUN"
mkdir -p "$T/chain_lone/ckpt"
cp -p "$CRUN/ckpt/step_00000004.h5" "$T/chain_lone/ckpt/"
expect_bad 1 "$T/chain_lone/ckpt/step_00000004.h5: its chain base 'step_00000002.h5' is missing" -- \
  -in "$T/chain.deck" -var run "$T/chain_res" -resume "$T/chain_lone/ckpt/step_00000004.h5"
expect_bad 2 "$T/chain_lone/ckpt/step_00000004.h5: its chain base 'step_00000002.h5' is missing" -- \
  -in "$T/chain.deck" -var run "$T/chain_res" -resume "$T/chain_lone/ckpt/step_00000004.h5"

# ----------------------------------------------------------------------------
# Positive controls: resume works on this deck, so the failures above are the
# damage's. Both append to, never rewrite, what was written.
begin "auto skips a truncated newest checkpoint (control)"
cp -a "$RUN" "$T/run2"
head -c 1000 "$KEEP/step_00000005.h5" >"$T/run2/ckpt/step_00000005.h5"
cp -p "$T/run2/metrics.jsonl" "$T/metrics2.before"
expect_ok 1 -in "$DECK" -var run "$T/run2" -var steps 6 -resume auto
check grep -q -F "resumed from $T/run2/ckpt/step_00000004.h5 at step 4" "$T/out" ||
  { fail "did not resume from step 4"; show_run; }

begin "resume from the newest checkpoint (control)"
cp -p "$RUN/metrics.jsonl" "$T/metrics.before"
expect_ok 1 -in "$DECK" -var steps 6 -resume "$CK"
check grep -q -F "resumed from $CK at step 5" "$T/out" || { fail "did not resume from step 5"; show_run; }
n=$(stat -c %s "$T/metrics.before")
check cmp -s -n "$n" "$T/metrics.before" "$RUN/metrics.jsonl" ||
  fail "metrics.jsonl was rewritten by a resumed run (expected records appended)"
check [ "$(stat -c %s "$RUN/metrics.jsonl")" -gt "$n" ] || fail "the resumed run appended no metrics"

finish
