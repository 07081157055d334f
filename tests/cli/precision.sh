#!/usr/bin/env bash
# Mixed precision on the GEMM seam (issue 8/13, kernels/gemm.h):
#  - determinism: the same deck, seed and world size give bit-identical
#    curves (every field but the timings) in fp32, bf16 and fp16, at 1, 2 and
#    4 ranks, on the small DeepSeek model of the golden curves (MLA, MoE with
#    a varying token count per expert, MTP);
#  - accuracy: 200 steps of input/deepseek-tiny.deck in bf16 reach a
#    validation loss within 1% of fp32's, from the same seeds;
#  - start-up names the GEMM kernel, and says whether bf16 runs natively or
#    is emulated; `gemm blas` runs bf16 emulated and says so;
#  - `precision bf16 products widened` (the fp32 kernel) is deterministic and
#    agrees with native bf16 to rounding;
#  - `precision fp16 clip_order scaled` (clipping before unscaling, the wrong
#    order) measures the same gradient norm and trains worse.
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/lib.sh"
root="$here/../.."
"$root/tools/prepare-data" >/dev/null || { echo "tools/prepare-data failed" >&2; exit 1; }
data="$root/data/fortunes.txt"

deck_for() {  # deck_for PRECISION [GEMM] > deck
  printf 'include %s/../golden/decks/base.deck\ndata bytes ${data} valid 0.05 batch 2 workers 1\n' "$here"
  printf 'eval every 3 batches 2\n'
  printf 'precision %s\n' "$1"
  [ -n "${2:-}" ] && printf 'gemm %s\n' "$2"
  printf 'run 6\n'
}

for p in fp32 bf16 fp16; do
  deck_for "$p" >"$T/$p.deck"
  for np in 1 2 4; do
    begin "$p at $np rank(s): two runs, the same bits"
    for r in a b; do
      run_xx "$np" -in "$T/$p.deck" -var data "$data" -var run_dir "$T/$p-$np-$r"
      check [ "$RC" -eq 0 ] || { fail "run $r: exit code $RC"; show_run; }
      curve "$T/$p-$np-$r/metrics.jsonl" "$T/$p-$np-$r.jsonl"
    done
    check [ "$(grep -c '"step"' "$T/$p-$np-a.jsonl")" -ge 6 ] && check grep -q val_loss "$T/$p-$np-a.jsonl" ||
      fail "expected 6 steps and a validation loss in metrics.jsonl"
    check cmp -s "$T/$p-$np-a.jsonl" "$T/$p-$np-b.jsonl" || {
      fail "the two runs differ"; diff "$T/$p-$np-a.jsonl" "$T/$p-$np-b.jsonl" | head -4 | cut -c1-300 >&2; }
  done
done

begin "start-up names the GEMM kernel and says how bf16 runs"
run_xx 1 -in "$T/bf16.deck" -var data "$data" -var run_dir "$T/startup"
check grep -Eq '^  gemm +(onednn: oneDNN [0-9.]+ matmul|blas: KokkosBlas::gemm)' "$T/out" || fail "no gemm row"
check grep -Eq '^  gemm .*bf16 (products run natively|is EMULATED)' "$T/out" || fail "the gemm row does not say how bf16 runs"
deck_for bf16 blas >"$T/bf16-blas.deck"
run_xx 1 -in "$T/bf16-blas.deck" -var data "$data" -var run_dir "$T/blas"
check [ "$RC" -eq 0 ] || { fail "gemm blas: exit code $RC"; show_run; }
check grep -Eq '^  gemm +blas: .*bf16 is EMULATED' "$T/out" || fail "gemm blas: no line saying bf16 is emulated"
curve "$T/blas/metrics.jsonl" "$T/blas.jsonl"
# Emulated bf16 multiplies the same 16-bit values in fp32: the curves agree to rounding.
said=$(/usr/bin/python3 "$here/../golden/compare.py" close "$T/bf16-1-a.jsonl" "$T/blas.jsonl") ||
  fail "bf16 on blas (emulated) and on the default backend disagree: $said"

begin "bf16 products widened to the fp32 kernel: deterministic, and the same curve to rounding"
sed 's/^precision bf16$/precision bf16 products widened/' "$T/bf16.deck" >"$T/bf16-widened.deck"
for r in a b; do
  run_xx 2 -in "$T/bf16-widened.deck" -var data "$data" -var run_dir "$T/widened-$r"
  check [ "$RC" -eq 0 ] || { fail "run $r: exit code $RC"; show_run; }
  curve "$T/widened-$r/metrics.jsonl" "$T/widened-$r.jsonl"
done
check grep -Eq '^  gemm .*bf16 (products widened to fp32|is EMULATED)' "$T/out" || fail "the gemm row does not say bf16 is widened"
check cmp -s "$T/widened-a.jsonl" "$T/widened-b.jsonl" || fail "two widened runs differ"
said=$(/usr/bin/python3 "$here/../golden/compare.py" close "$T/bf16-2-a.jsonl" "$T/widened-a.jsonl") ||
  fail "widened and native bf16 disagree: $said"

begin "fp16 clip_order scaled (the wrong order): the same gradient norm at step 1, a worse loss after"
sed 's/^precision fp16$/precision fp16 clip_order scaled/' "$T/fp16.deck" >"$T/fp16-scaled.deck"
run_xx 1 -in "$T/fp16-scaled.deck" -var data "$data" -var run_dir "$T/scaled"
check [ "$RC" -eq 0 ] || { fail "exit code $RC"; show_run; }
/usr/bin/python3 - "$T/fp16-1-a/metrics.jsonl" "$T/scaled/metrics.jsonl" <<'PY' || fail "clip_order scaled: no harm shown"
import json, sys
right, wrong = ([json.loads(l) for l in open(p)] for p in sys.argv[1:3])
first = right[0]["grad_norm"] == wrong[0]["grad_norm"]  # clipping changes the update, not the norm measured
last = wrong[-1]["loss"] - right[-1]["loss"]
print(f"    step 1 grad_norm {right[0]['grad_norm']:.4f} both: {first}; step {right[-1]['step']} loss right "
      f"{right[-1]['loss']:.4f}, wrong {wrong[-1]['loss']:.4f}")
sys.exit(0 if first and last > 0.05 else 1)
PY

begin "200 steps of deepseek-tiny: bf16's validation loss within 1% of fp32's"
for p in fp32 bf16; do
  sed "s/^seed 1234/seed 1234\nprecision $p/" "$root/input/deepseek-tiny.deck" >"$T/ds-$p.deck"
  run_xx 1 -in "$T/ds-$p.deck" -var data "$data" -var run_dir "$T/ds-$p" -var steps 200 -var eval_every 200 \
    -var ckpt_every 0 -var log_every 50
  check [ "$RC" -eq 0 ] || { fail "$p: exit code $RC"; show_run; }
done
/usr/bin/python3 - "$T/ds-fp32/metrics.jsonl" "$T/ds-bf16/metrics.jsonl" <<'PY' || fail "bf16 is more than 1% off fp32"
import json, sys
val = [[json.loads(l)["val_loss"] for l in open(p) if "val_loss" in l][-1] for p in sys.argv[1:3]]
rel = abs(val[1] - val[0]) / val[0]
print(f"    validation loss at step 200: fp32 {val[0]:.5f}, bf16 {val[1]:.5f} ({100 * rel:.3f}% apart)")
sys.exit(0 if rel <= 0.01 else 1)
PY
finish
