#!/usr/bin/env bash
# A checkpoint that cannot be written ends the job, on every rank, promptly
# (docs/RESILIENCE.md, "A failed checkpoint write"). 2 ranks, a small model
# with many tensors (so that HDF5's metadata is a good part of a file), run
# directories on a tmpfs of our own:
#   - a disk with room for the first checkpoint and not for the second, with
#     `checkpoint async off` and `async on`: rank 0 finds there is no room
#     before HDF5 starts;
#   - room for the second checkpoint's datasets but not for all of its file:
#     the write fails inside HDF5, in a collective call that the other rank
#     never leaves; the failing rank's deadline ends the job (async off and on);
#     with `writer rank0` (80 % and 96 %: where HDF5 itself would fail in a
#     dataset and in its final flush), rank 0 alone fails to write the file:
#     exit code 4 exactly (an HDF5 file left open would crash at exit: 139),
#     no HDF5 object left open, and the error is the write's, not the room
#     check's;
#   - a checkpoint directory that became read-only (a read-only bind mount;
#     root ignores permissions), between a run and its resume;
#   - the run directory removed while the job runs.
# Each must end within 60 s with exit code 4 and one line on stderr naming
# the file, the error ("No space left on device", ...) and the last good
# checkpoint; no .tmp may be left, the earlier checkpoint must still verify
# (tools/ckpt verify) and `latest` must still name it.
# Mounting needs root (this machine and CI run the tests as root); any other
# user fails here rather than skipping.
# usage: full_disk.sh XUANXUE [MPIEXEC]
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
CKPT_TOOL="$(dirname "${BASH_SOURCE[0]}")/../../tools/ckpt"
RUN_TIMEOUT=120  # a hang is a failure; the bound checked below is 60 s
BOUND=60

if [ "$(id -u)" -ne 0 ]; then
  echo "FAIL: mounting the test's tmpfs needs root (this user is $(id -un))" >&2
  exit 1
fi

MNT=$T/mnt
mkdir -p "$MNT"
cleanup() {
  grep -q " $MNT/" /proc/mounts && awk -v m="$MNT/" 'index($2, m) == 1 { print $2 }' /proc/mounts |
    sort -r | while read -r p; do umount "$p"; done
  mountpoint -q "$MNT" && umount "$MNT"
  rm -rf "$T"
}
trap cleanup EXIT

mount_tmpfs() {  # mount_tmpfs KB: a fresh, empty tmpfs of KB kilobytes on $MNT
  mountpoint -q "$MNT" && umount "$MNT"
  mount -t tmpfs -o "size=${1}k" tmpfs "$MNT" || { fail "cannot mount a tmpfs of ${1} KB on $MNT"; finish; }
}

make_corpus "$T/corpus.txt"
# 8 layers of width 16: 233 datasets in a checkpoint of 1.8 MB, of which
# about 0.8 MB are HDF5's own (object headers, chunk indexes, attributes).
cat >"$T/disk.deck" <<EOF
seed 1
model dense vocab 256 dim 16 layers 8 heads 2 ffn 32 seq 16
data bytes $T/corpus.txt valid 0.1 batch 2 workers 1
peak_gflops 50
output dir \${run_dir} log_every 1 tensorboard off
eval every 0 batches 1
variable writer collective
checkpoint every \${every} async \${async} writer \${writer}
run \${steps}
EOF

used_kb() { df -k --output=used "$MNT" | tail -n 1 | tr -d ' '; }
STEP5=step_00000005.h5

# The sizes, measured on this file system: a run to the first checkpoint.
begin "sizes: the first checkpoint on a roomy tmpfs"
mount_tmpfs 65536
run_xx 2 -in "$T/disk.deck" -var run_dir "$MNT/run" -var every 5 -var async off -var steps 5
check [ "$RC" -eq 0 ] || { fail "exit code $RC (expected 0)"; show_run; finish; }
USED=$(used_kb)
CKPT_KB=$(du -k "$MNT/run/ckpt/$STEP5" | cut -f1)
echo "    first checkpoint ${CKPT_KB} KB, the run directory ${USED} KB"

ELAPSED=0
run_timed() {  # run_timed NP ARGS...: run_xx, and ELAPSED: its wall seconds
  local start
  start=$(date +%s.%N)
  run_xx "$@"
  ELAPSED=$(echo "$(date +%s.%N) - $start" | bc)
}

# expect_write_failure RUN FILE ERROR LAST: the last run ended within the
# bound with exit code 4, and one stderr line names FILE, ERROR and LAST
# (LAST "": no earlier checkpoint to keep); nothing of FILE is left; LAST
# still verifies and `latest` names it.
expect_write_failure() {
  local run=$1 file=$2 error=$3 last=$4 before=$FAILS
  echo "    ended after ${ELAPSED} s with exit code $RC"
  check [ "$RC" -ne 124 ] || fail "still running after ${RUN_TIMEOUT} s: a failed write hung the job"
  check awk -v s="$ELAPSED" -v b="$BOUND" 'BEGIN { exit !(s < b) }' || fail "took ${ELAPSED} s (bound ${BOUND} s)"
  check [ "$RC" -eq 4 ] || fail "exit code $RC (expected 4: a checkpoint could not be written)"
  local lines
  lines=$(grep -c -F "checkpoint $run/ckpt/$file could not be written" "$T/err")
  check [ "$lines" -eq 1 ] || fail "$lines lines say $file could not be written (expected one)"
  check grep -F "checkpoint $run/ckpt/$file could not be written" "$T/err" | grep -q -F "$error" ||
    fail "the line does not say '$error'"
  if [ -n "$last" ]; then
    check grep -F "checkpoint $run/ckpt/$file could not be written" "$T/err" |
      grep -q -F "the last good checkpoint is $run/ckpt/$last" || fail "the line does not name $last as the last good one"
  fi
  check [ -z "$(find "$run" -name '*.tmp' 2>/dev/null)" ] || fail "left behind: $(find "$run" -name '*.tmp')"
  check [ ! -e "$run/ckpt/$file" ] || fail "$file exists"
  if [ -n "$last" ]; then
    check [ "$(cat "$run/ckpt/latest" 2>/dev/null)" = "$last" ] ||
      fail "latest says '$(cat "$run/ckpt/latest" 2>/dev/null)' (expected $last)"
    check /usr/bin/python3 "$CKPT_TOOL" verify "$run/ckpt/$last" >"$T/verify" 2>&1 ||
      { fail "$last no longer verifies"; sed 's/^/    /' "$T/verify" >&2; }
  fi
  [ "$FAILS" -eq "$before" ] || show_run
}

STEP10=step_00000010.h5
for async in off on; do
  # Room after the first checkpoint for a quarter of it: less than its
  # datasets alone, so rank 0's check before HDF5 finds no room.
  begin "async $async: no room for the second checkpoint"
  mount_tmpfs $((USED + CKPT_KB / 4))
  run_timed 2 -in "$T/disk.deck" -var run_dir "$MNT/run" -var every 5 -var async "$async" -var steps 100
  expect_write_failure "$MNT/run" "$STEP10" "No space left on device" "$STEP5"

  # Room for 80 %: the datasets (57 %) fit, the file does not; the write
  # fails inside HDF5 (chunks are written as datasets are made).
  for case in "collective 80" "rank0 80" "rank0 96"; do
    read -r writer percent <<<"$case"
    begin "async $async, writer $writer, room for $percent %: the disk fills up inside the write"
    mount_tmpfs $((USED + CKPT_KB * percent / 100))
    run_timed 2 -in "$T/disk.deck" -var run_dir "$MNT/run" -var every 5 -var async "$async" -var writer "$writer" \
      -var steps 100
    expect_write_failure "$MNT/run" "$STEP10" "No space left on device" "$STEP5"
    if [ "$writer" = rank0 ]; then
      check grep -q -F "rank 0 writes" "$T/out" || { fail "no checkpoint line says 'rank 0 writes'"; show_run; }
      check grep -F "could not be written" "$T/err" | grep -v -q -F "no room for its" ||
        fail "the room check caught it (expected the write to fail inside HDF5)"
      refute grep -q -i "segmentation\|signal 11" "$T/err" || { fail "a segfault at exit"; show_run; }
      refute grep -q -F "HDF5 still holds" "$T/err" || { fail "HDF5 ids left open after the failed write"; show_run; }
    fi
  done
done

begin "a read-only checkpoint directory: the resume's first checkpoint cannot be written"
mount_tmpfs 65536
run_xx 2 -in "$T/disk.deck" -var run_dir "$MNT/run" -var every 5 -var async off -var steps 5
check [ "$RC" -eq 0 ] || { fail "first run: exit code $RC (expected 0)"; show_run; }
if ! { mount --bind "$MNT/run/ckpt" "$MNT/run/ckpt" && mount -o remount,bind,ro "$MNT/run/ckpt"; }; then
  fail "cannot make $MNT/run/ckpt read-only"
fi
run_timed 2 -in "$T/disk.deck" -var run_dir "$MNT/run" -var every 5 -var async off -var steps 100 -resume auto
expect_write_failure "$MNT/run" "$STEP10" "Read-only file system" "$STEP5"
check grep -q "resumed from $MNT/run/ckpt/$STEP5" "$T/out" || { fail "did not resume from $STEP5"; show_run; }
umount "$MNT/run/ckpt"

begin "the run directory removed while the job runs"
mount_tmpfs 65536
# A checkpoint every 200 steps: a second or more between the first one and
# the next, for the run directory to go.
LAST_CMD="$MPIEXEC -n 2 $XX -in disk.deck (every 200, the run directory removed after the first)"
"$MPIEXEC" --oversubscribe --bind-to none -n 2 "$XX" -in "$T/disk.deck" -var run_dir "$MNT/run" -var every 200 \
  -var async off -var steps 100000 >"$T/out" 2>"$T/err" &
pid=$!
for ((i = 0; i < 1200; ++i)); do [ -s "$MNT/run/ckpt/latest" ] && break; sleep 0.1; done
check [ -s "$MNT/run/ckpt/latest" ] || fail "no first checkpoint after 120 s"
rm -rf "$MNT/run"
start=$(date +%s.%N)
for ((i = 0; i < 10 * RUN_TIMEOUT; ++i)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
kill -0 "$pid" 2>/dev/null && { fail "still running ${RUN_TIMEOUT} s after the run directory went"; kill -KILL "$pid"; }
wait "$pid"
RC=$?
ELAPSED=$(echo "$(date +%s.%N) - $start" | bc)
STEP400=step_00000400.h5
expect_write_failure "$MNT/run" "$STEP400" "is gone: No such file or directory" ""
check grep -F "could not be written" "$T/err" | grep -q -F "the last good checkpoint is none" ||
  { fail "the line does not say that no good checkpoint is left"; show_run; }

finish
