#!/usr/bin/env bash
# tools/ckpt export on real per-rank checkpoints (2 ranks, `sync local 4`, so
# the ranks differ from the base): for each codec an independent h5py rebuild
# (tests/ckpt_h5py_rebuild.py, docs/CHECKPOINT.md alone) matches the export of
# rank 1 bit for bit; the lossless export equals the rank's own bits in a
# `mode full` run of the same deck; xuanxue resumes from an export; bf16
# moments stay 16-bit through a checkpoint and its export; and a file
# without /ranks, a rank out of range and a bad checksum end with exit 2.
# usage: ckpt_export.sh XUANXUE [MPIEXEC]
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
HERE="$(dirname "${BASH_SOURCE[0]}")"
CKPT="$HERE/../../tools/ckpt"
REBUILD="$HERE/../ckpt_h5py_rebuild.py"
PY=/usr/bin/python3

CORPUS=$T/corpus.txt
make_corpus "$CORPUS"

# train_with NAME CHECKPOINT_OPTIONS: 3 steps at 2 ranks, checkpoints after step 2 and at the end, in
# $T/NAME/ckpt. The checks use step 2: the end of a run averages the parameters, so there the ranks agree.
train_with() {
  make_deck "$T/$1.deck" "$CORPUS" "$T/$1" "2 $2"
  sed -i '10a sync local 4' "$T/$1.deck"
  begin "train 2 ranks, sync local 4, checkpoint $2"
  expect_ok 2 -in "$T/$1.deck"
}

CODECS=(lossless int8 topk)
declare -A OPTIONS=([lossless]="mode diff codec lossless" [int8]="mode diff codec int8"
                    [topk]="mode diff codec topk ratio 0.1")
for codec in "${CODECS[@]}"; do train_with "$codec" "${OPTIONS[$codec]}"; done
train_with full "mode full"
[ "$FAILS" -eq 0 ] || finish
at_step2() { echo "$T/$1/ckpt/step_00000002.h5"; }

for codec in "${CODECS[@]}"; do
  begin "$codec: the h5py rebuild of rank 1 matches tools/ckpt export bit for bit"
  check $PY "$REBUILD" "$(at_step2 "$codec")" 1 "$CKPT" >"$T/out" 2>&1 || fail "$(cat "$T/out")"
  check grep -q "(${codec}, " "$T/out" || fail "the rank was not stored with $codec: $(cat "$T/out")"
done

begin "lossless: rank 1 differs from the base (else the checks above prove little)"
check $PY -c '
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "r") as f:
    sys.exit(0 if np.count_nonzero(f["ranks/1/params"][()]) > 0 else 1)' "$(at_step2 lossless)" ||
  fail "every XOR diff of /ranks/1/params is zero"

begin "lossless export equals the rank's own bits in a mode full run of the same deck"
check $PY "$CKPT" export "$(at_step2 lossless)" --rank 1 -o "$T/lossless_r1.h5" >"$T/out" 2>&1 || fail "$(cat "$T/out")"
check $PY "$CKPT" export "$(at_step2 full)" --rank 1 -o "$T/full_r1.h5" >"$T/out" 2>&1 || fail "$(cat "$T/out")"
check $PY -c '
import sys, h5py, numpy as np
exported, full = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r")
bad = 0
for name, group in (("params", "model"), ("adam_m", "optimizer/m"), ("adam_v", "optimizer/v")):
    own = full["ranks/1/" + name][()]
    for tensor, ds in full["model"].items():
        start = int(ds.attrs["offset"])
        mine = exported[group][tensor][()].ravel()
        if not np.array_equal(mine.view(np.uint32), own[start:start + mine.size].view(np.uint32)):
            print(f"/{group}/{tensor} differs from /ranks/1/{name} of the full run")
            bad += 1
sys.exit(1 if bad else 0)' "$T/lossless_r1.h5" "$(at_step2 full)" >"$T/out" 2>&1 || fail "$(cat "$T/out")"
check cmp -s <(h5dump -d /model/head "$T/lossless_r1.h5" | tail -n +2) <(h5dump -d /model/head "$T/full_r1.h5" | tail -n +2) ||
  fail "the exports of the lossless and the full run differ in /model/head"

begin "the export is a version-1 checkpoint that verify passes and xuanxue resumes from"
check $PY "$CKPT" verify "$T/lossless_r1.h5" >"$T/out" 2>&1 || fail "$(cat "$T/out")"
check [ "$(h5dump -a /format_version "$T/lossless_r1.h5" | grep -c '(0): 1$')" -eq 1 ] || fail "format_version is not 1"
check [ ! -e "$T/lossless_r1.h5.tmp" ] || fail "the temp file was left behind"
# the same deck into a fresh output dir: step 3 from rank 1's state; the export keeps the world size (2)
sed -e "s|dir $T/lossless |dir $T/resumed |" "$T/lossless.deck" >"$T/resume.deck"
expect_ok 2 -in "$T/resume.deck" -resume "$T/lossless_r1.h5"
check grep -q -E '^step +3/3' "$T/out" || fail "no step 3 after the resume: $(tail -3 "$T/out")"

begin "moments bf16: stored as kept (uint16, encoding bfloat16), exported so, and resumed from the export"
make_deck "$T/bf16.deck" "$CORPUS" "$T/bf16" "2 mode full"
sed -i '10a sync local 4' "$T/bf16.deck"
sed -i '10a optimizer adamw lr 1e-3 moments bf16' "$T/bf16.deck"
expect_ok 2 -in "$T/bf16.deck"
check $PY "$CKPT" export "$(at_step2 bf16)" --rank 1 -o "$T/bf16_r1.h5" >"$T/out" 2>&1 || fail "$(cat "$T/out")"
check $PY -c '
import sys, h5py, numpy as np
bad = 0
for path in sys.argv[1:]:
    with h5py.File(path, "r") as f:
        for g in ("optimizer/m", "optimizer/v"):
            for name, ds in f[g].items():
                enc = ds.attrs.get("encoding", b"")
                if ds.dtype != np.uint16 or (enc.decode() if isinstance(enc, bytes) else enc) != "bfloat16":
                    print(f"{path}: /{g}/{name} is {ds.dtype}, encoding {enc!r} (expected uint16, bfloat16)")
                    bad += 1
sys.exit(1 if bad else 0)' "$(at_step2 bf16)" "$T/bf16_r1.h5" >"$T/out" 2>&1 || fail "$(cat "$T/out")"
check $PY "$CKPT" verify "$T/bf16_r1.h5" >"$T/out" 2>&1 || fail "$(cat "$T/out")"
# mode diff: the ranks' moments are diffs against the base's average rounded to bf16, as the file holds it;
# rank 1 exported from it has the bits of its export from the mode full run
sed -e "s|dir $T/bf16 |dir $T/bf16_diff |" -e "s|checkpoint every 2 mode full|checkpoint every 2 mode diff codec lossless|" \
  "$T/bf16.deck" >"$T/bf16_diff.deck"
expect_ok 2 -in "$T/bf16_diff.deck"
check $PY "$CKPT" export "$(at_step2 bf16_diff)" --rank 1 -o "$T/bf16_diff_r1.h5" >"$T/out" 2>&1 || fail "$(cat "$T/out")"
check $PY -c '
import sys, h5py, numpy as np
a, b = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r")
bad = [f"/{g}/{n}" for g in ("model", "optimizer/m", "optimizer/v") for n in a[g]
       if a[g][n].dtype != b[g][n].dtype or not np.array_equal(a[g][n][()], b[g][n][()])]
print("differ:", bad)
sys.exit(1 if bad else 0)' "$T/bf16_r1.h5" "$T/bf16_diff_r1.h5" >"$T/out" 2>&1 || fail "$(cat "$T/out")"
sed -e "s|dir $T/bf16 |dir $T/bf16_resumed |" "$T/bf16.deck" >"$T/bf16_resume.deck"
expect_ok 2 -in "$T/bf16_resume.deck" -resume "$T/bf16_r1.h5"
check grep -q -E '^step +3/3' "$T/out" || fail "no step 3 after the resume: $(tail -3 "$T/out")"

begin "export refuses a file without /ranks, a rank out of range and a bad checksum (exit 2, one message)"
expect_export_error() {  # expect_export_error WHAT FILE RANK MESSAGE
  $PY "$CKPT" export "$2" --rank "$3" -o "$T/x.h5" >"$T/out" 2>"$T/err"
  local rc=$?
  check [ $rc -eq 2 ] || fail "$1: exit code $rc (expected 2)"
  check [ "$(wc -l <"$T/err")" -eq 1 ] || fail "$1: expected one line on stderr: $(cat "$T/err")"
  check grep -q -F -- "ckpt: $2: $4" "$T/err" || fail "$1: $(cat "$T/err")"
  check [ ! -e "$T/x.h5" ] && check [ ! -e "$T/x.h5.tmp" ] || fail "$1: something was written"
}
expect_export_error "no /ranks" "$T/lossless_r1.h5" 0 "group '/ranks' is missing"
expect_export_error "rank 2 of 2" "$(at_step2 lossless)" 2 "rank 2 out of range (the file holds ranks 0 to 1)"
# flip one byte inside the first chunk of /ranks/1/params: fletcher32 (or crc32c) catches it
cp "$(at_step2 lossless)" "$T/bad.h5"
read -r chunk_bytes chunk_address < <(h5ls -r -v -a "$T/bad.h5" |
  awk '$1 == "/ranks/1/params" { f = 1; next } f && $1 ~ /^0x/ { print $2, $3; exit }')
offset=$((chunk_address + chunk_bytes / 2))
byte=$(od -An -tu1 -j "$offset" -N1 "$T/bad.h5" | tr -d ' ')
printf -v hex '%02x' $((byte ^ 0xff))
printf "\\x$hex" | dd of="$T/bad.h5" bs=1 seek="$offset" conv=notrunc status=none
expect_export_error "flipped byte" "$T/bad.h5" 1 "dataset '/ranks/1/params' cannot be read (checksum mismatch"
finish
