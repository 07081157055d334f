#!/usr/bin/env bash
# The GPU build's host/device traffic, checked on the host build
# (XX_EMULATE_DEVICE=1, core/device_memory.h): every path takes its device
# branch (host mirrors that are copies, MPI staged through host buffers,
# flash attention by auto) and any host read or write of kernel memory
# outside a kernel, a deep_copy or a GEMM stops the run, naming the buffer.
#  - deepseek-tiny (MLA, MoE, MTP) at 2 ranks trains, validates, samples and
#    checkpoints under the emulation in fp32, bf16, ep 2, compressed
#    gradients and local SGD over a ring, and each curve equals the host
#    run's with the same attention kernel bit for bit;
#  - a run resumed under the emulation from its own checkpoint follows the
#    uninterrupted run bit for bit;
#  - shard optimizer and params (bf16) stage their collectives through host
#    memory and follow the host run bit for bit;
#  - the dense transport (sync ... transport auto|nccl|mpi) with a simulated
#    GPU count (XX_EMULATE_GPUS): 2 ranks sharing 1 GPU take MPI under auto,
#    saying why, and refuse transport nccl with exit 2; with a GPU each, auto
#    takes (emulated) NCCL, alone and under shard optimizer and params, and
#    every curve is the host run's bit for bit.
# That a host touch is caught is unit_tests "[device_emulation]".
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/lib.sh"
root="$here/../.."
"$root/tools/prepare-data" >/dev/null || { echo "tools/prepare-data failed" >&2; exit 1; }
data="$root/data/fortunes.txt"
export OMP_NUM_THREADS=1

deck_with() {  # deck_with NAME LINE... : deepseek-tiny with LINEs before its run line
  local name=$1
  shift
  grep -v '^run ' "$root/input/deepseek-tiny.deck" >"$T/$name.deck"
  for line in "$@"; do printf '%s\n' "$line" >>"$T/$name.deck"; done
  printf 'run ${steps}\n' >>"$T/$name.deck"
}
args=(-var data "$data" -var steps 4 -var log_every 1 -var eval_every 2 -var ckpt_every 2 -var attention_kernel flash)

run_emulated() {  # run_emulated NP ARGS...: as run_xx, with XX_EMULATE_DEVICE=1 on every rank
  local np=$1
  shift
  if [ "$np" -eq 1 ]; then
    XX_EMULATE_DEVICE=1 timeout "$RUN_TIMEOUT" "$XX" "$@" >"$T/out" 2>"$T/err"
  else
    XX_EMULATE_DEVICE=1 timeout "$RUN_TIMEOUT" "$MPIEXEC" -x XX_EMULATE_DEVICE ${XX_EMULATE_GPUS:+-x XX_EMULATE_GPUS} \
      --oversubscribe --bind-to none \
      -n "$np" "$XX" "$@" >"$T/out" 2>"$T/err"
  fi
  RC=$?
}

deck_with dense
deck_with bf16 'precision bf16'
deck_with compress 'compress topk 0.1 quant int8 transport mpi'
deck_with ring 'sync local 2' 'topology ring'
deck_with sample "sample every 2 prompt 'The ' tokens 8"
for case in "dense 1" "dense 2" "bf16 2" "dense 2 -var ep 2" "compress 2" "ring 2" "sample 2"; do
  set -- $case
  name=$1 np=$2
  shift 2
  tag="$name-$np${1:+-ep}"
  begin "$tag: trains under the emulation, the host run's curve bit for bit"
  run_emulated "$np" -in "$T/$name.deck" "${args[@]}" -var run_dir "$T/$tag-em" "$@"
  check [ "$RC" -eq 0 ] || { fail "emulated: exit code $RC"; tail -30 "$T/err" >&2; continue; }
  check grep -q 'kernel memory .*emulated device' "$T/out" || fail "the start-up report does not say the device is emulated"
  if [ "$np" -gt 1 ] && [ "$name" != compress ] && [ "$name" != ring ]; then
    check grep -q 'each bucket staged through host memory' "$T/out" || fail "the dense all-reduce does not say it stages"
    check grep -q 'mpi (nccl: 2 ranks on a node share 1 visible GPU' "$T/out" ||
      fail "auto does not say why it passed NCCL over: $(grep 'dense all-reduce' "$T/out")"
  fi
  run_xx "$np" -in "$T/$name.deck" "${args[@]}" -var run_dir "$T/$tag-host" "$@"
  check [ "$RC" -eq 0 ] || { fail "host: exit code $RC"; show_run; continue; }
  curve "$T/$tag-em/metrics.jsonl" "$T/$tag-em.jsonl"
  curve "$T/$tag-host/metrics.jsonl" "$T/$tag-host.jsonl"
  check [ "$(grep -c '"step"' "$T/$tag-em.jsonl")" -ge 4 ] && check grep -q val_loss "$T/$tag-em.jsonl" ||
    fail "expected 4 steps and a validation loss"
  check cmp -s "$T/$tag-em.jsonl" "$T/$tag-host.jsonl" ||
    { fail "the emulated curve differs from the host's"; diff "$T/$tag-em.jsonl" "$T/$tag-host.jsonl" | head -4 >&2; }
  [ "$name" = sample ] && { check grep -q 'sample' "$T/out" || fail "no sample printed"; }
done

begin "a resume under the emulation from its own step-2 checkpoint follows the uninterrupted run"
cp -r "$T/dense-2-em" "$T/resumed"
rm -f "$T/resumed"/ckpt/step_00000004*
echo step_00000002.h5 >"$T/resumed/ckpt/latest"
/usr/bin/python3 - "$T/resumed/metrics.jsonl" <<'PY'  # what a run stopped after step 2 had logged
import json, sys
lines = [l for l in open(sys.argv[1]) if json.loads(l)["step"] <= 2]
open(sys.argv[1], "w").writelines(lines)
PY
run_emulated 2 -in "$T/dense.deck" "${args[@]}" -var run_dir "$T/resumed" -resume auto
check [ "$RC" -eq 0 ] || { fail "resume: exit code $RC"; tail -30 "$T/err" >&2; }
check grep -q 'resumed from .*step_00000002.h5 at step 2' "$T/out" || fail "it did not resume from step 2"
curve "$T/resumed/metrics.jsonl" "$T/resumed.jsonl" 2
curve "$T/dense-2-em/metrics.jsonl" "$T/whole.jsonl" 2
check [ -s "$T/resumed.jsonl" ] && check cmp -s "$T/resumed.jsonl" "$T/whole.jsonl" ||
  fail "the resumed steps 3-4 differ from the uninterrupted run's"

follows_host() {  # follows_host NAME [HOST]: the curve of run NAME-em equals HOST's (default NAME-host) bit for bit
  local host=${2:-$1-host}
  curve "$T/$1-em/metrics.jsonl" "$T/$1-em.jsonl"
  curve "$T/$host/metrics.jsonl" "$T/$host.jsonl"
  check cmp -s "$T/$1-em.jsonl" "$T/$host.jsonl" ||
    { fail "the emulated curve differs from the host's"; diff "$T/$1-em.jsonl" "$T/$host.jsonl" | head -4 >&2; }
}

for level in optimizer params; do
  begin "shard $level under the emulation (bf16: the fp32 master sharded), the host run's curve bit for bit"
  deck_with "shard-$level" 'precision bf16'
  run_emulated 2 -in "$T/shard-$level.deck" "${args[@]}" -var run_dir "$T/shard-$level-em" -var shard "$level"
  check [ "$RC" -eq 0 ] || { fail "emulated: exit code $RC"; tail -30 "$T/err" >&2; continue; }
  check grep -q 'each collective over MPI, staged through host memory' "$T/out" || fail "the sync strategy does not say it stages"
  run_xx 2 -in "$T/shard-$level.deck" "${args[@]}" -var run_dir "$T/shard-$level-host" -var shard "$level"
  check [ "$RC" -eq 0 ] || { fail "host: exit code $RC"; show_run; continue; }
  follows_host "shard-$level"
done

begin "sync dense transport nccl, 2 ranks sharing 1 emulated GPU: exit 2, saying why"
run_emulated 2 -in "$T/dense.deck" "${args[@]}" -var run_dir "$T/nccl-shared" -var transport nccl
check [ "$RC" -eq 2 ] || fail "exit code $RC (expected 2)"
check grep -q 'sync transport nccl: NCCL cannot carry the dense sums here: 2 ranks on a node share 1 visible GPU' \
  "$T/err" || fail "the error does not say why: $(head -3 "$T/err")"
check [ ! -e "$T/nccl-shared/metrics.jsonl" ] || fail "a refused run wrote metrics"

# A GPU per rank: auto takes (emulated) NCCL; sync dense, shard optimizer and shard params each follow the
# host run (MPI on host memory) bit for bit. Before 14/18 a shard level refused any dense transport but MPI.
for level in off optimizer params; do
  begin "2 emulated GPUs for 2 ranks, shard $level: auto takes NCCL, the host run's curve bit for bit"
  XX_EMULATE_GPUS=2 run_emulated 2 -in "$T/dense.deck" "${args[@]}" -var run_dir "$T/nccl-$level-em" -var shard "$level"
  check [ "$RC" -eq 0 ] || { fail "emulated: exit code $RC"; tail -30 "$T/err" >&2; continue; }
  check grep -q 'dense all-reduce *nccl; emulated' "$T/out" || fail "auto did not take NCCL: $(grep 'dense all-reduce' "$T/out")"
  [ "$level" = off ] || check grep -q 'each collective over MPI' "$T/out" || fail "the sharded strategy does not say MPI"
  if [ "$level" = off ]; then  # the deck's own level: the host run of the first case above
    follows_host nccl-off dense-2-host
    continue
  fi
  run_xx 2 -in "$T/dense.deck" "${args[@]}" -var run_dir "$T/nccl-$level-host" -var shard "$level"
  check [ "$RC" -eq 0 ] || { fail "host: exit code $RC"; show_run; continue; }
  follows_host "nccl-$level"
done

finish
