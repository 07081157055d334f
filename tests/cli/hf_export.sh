#!/usr/bin/env bash
# tools/ckpt export FILE --format hf OUT_DIR: three trained models exported
# (dense MHA as Llama; MLA with a query latent, sigmoid-gated MoE with its
# balance bias and MTP as DeepSeek-V3; MLA with a softmax-gated MoE as
# DeepSeek-V2), each read back by tests/hf_check.py (its own safetensors
# reader, and the forward pass as the HF model code defines it, from
# config.json alone), which must reproduce the run's last validation loss
# within 1e-5. Refusals and bad input: exit 2, one line naming the option or
# the file, nothing written.
# usage: hf_export.sh XUANXUE [MPIEXEC]
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CKPT="/usr/bin/python3 $ROOT/tools/ckpt"
CHECK="/usr/bin/python3 $ROOT/tests/hf_check.py"
CORPUS=$T/corpus.txt
cat /usr/share/games/fortunes/fortunes >"$CORPUS"

# train NAME NP MODEL_LINES: 6 steps, validation (2 batches) and a checkpoint at the end
train() {
  local name=$1 np=$2
  shift 2
  {
    echo "seed 3"
    printf '%s\n' "$@"
    echo "data bytes $CORPUS valid 0.1 batch 2 workers 1"
    echo "optimizer adamw lr 3e-3"
    echo "output dir $T/$name log_every 1"
    echo "eval every 0 batches 2"
    echo "run 6"
  } >"$T/$name.deck"
  begin "train $name on $np rank(s) (setup)"
  expect_ok "$np" -in "$T/$name.deck"
}
train dense 1 "model dense vocab 256 dim 32 layers 2 heads 2 ffn 64 seq 32"
train v3 2 "model deepseek vocab 256 dim 32 layers 3 heads 2 ffn 64 seq 32" \
  "attention mla kv_lora_rank 16 q_lora_rank 12 qk_nope_dim 8 rope_dim 8 v_dim 8" \
  "moe on dense_layers 1 shared 1 routed 4 topk 2 ffn 16 gate sigmoid balance bias balance_coef 0.01 route_scale 1.5" \
  "mtp depth 1 weight 0.3"
train v2 1 "model deepseek vocab 256 dim 32 layers 2 heads 2 ffn 64 seq 32" \
  "attention mla kv_lora_rank 16 q_lora_rank 0 qk_nope_dim 8 rope_dim 8 v_dim 8" \
  "moe on dense_layers 1 shared 2 routed 4 topk 2 ffn 16 gate softmax balance aux"
train softmax_mtp 1 "model deepseek vocab 256 dim 32 layers 2 heads 2 ffn 64 seq 32" \
  "attention mla kv_lora_rank 16 q_lora_rank 0 qk_nope_dim 8 rope_dim 8 v_dim 8" \
  "moe on dense_layers 1 shared 1 routed 4 topk 2 ffn 16 gate softmax balance aux" "mtp depth 1"
train softmax_bias 1 "model deepseek vocab 256 dim 32 layers 2 heads 2 ffn 64 seq 32" \
  "attention mla kv_lora_rank 16 q_lora_rank 0 qk_nope_dim 8 rope_dim 8 v_dim 8" \
  "moe on dense_layers 1 shared 1 routed 4 topk 2 ffn 16 gate softmax balance bias"
[ "$FAILS" -eq 0 ] || finish

# export NAME FAMILY WORLD [ARGS...]: exports the run's checkpoint and checks it against its val_loss
export_check() {
  local name=$1 family=$2 world=$3
  shift 3
  begin "$name: exported as $family, the HF forward reproduces the val_loss"
  $CKPT export "$T/$name/ckpt/step_00000006.h5" --format hf "$T/hf_$name" "$@" >"$T/out" 2>"$T/err"
  check [ $? -eq 0 ] || { fail "export: $(cat "$T/err")"; return; }
  check grep -q "($family)" "$T/out" || fail "export says: $(cat "$T/out")"
  check grep -q "\"model_type\": \"$family\"" "$T/hf_$name/config.json" || fail "config.json is not $family"
  $CHECK "$T/hf_$name" "$CORPUS" "$T/$name/metrics.jsonl" --batch 2 --world "$world" --eval-batches 2 --valid 0.1 \
    >"$T/check" 2>&1
  check [ $? -eq 0 ] || fail "$(cat "$T/check")"
  cat "$T/check"
}
export_check dense llama 1
export_check v3 deepseek_v3 2
export_check v2 deepseek_v2 1
export_check softmax_mtp deepseek_v2 1 --drop-mtp  # V2 has no MTP: the main model, exactly

begin "v3: the MTP module under DeepSeek-V3's names, its selection biases as e_score_correction_bias"
/usr/bin/python3 - "$T/hf_v3/model.safetensors" <<'PY' || fail "MTP or bias tensors missing"
import json, struct, sys
blob = open(sys.argv[1], "rb").read()
names = set(json.loads(blob[8:8 + struct.unpack("<Q", blob[:8])[0]]))
need = {"model.layers.3.eh_proj.weight", "model.layers.3.enorm.weight", "model.layers.3.hnorm.weight",
        "model.layers.3.shared_head.head.weight", "model.layers.3.shared_head.norm.weight",
        "model.layers.3.mlp.gate.e_score_correction_bias", "model.layers.1.mlp.gate.e_score_correction_bias",
        "model.layers.0.self_attn.q_a_proj.weight", "model.layers.2.mlp.shared_experts.up_proj.weight"}
sys.exit(0 if need <= names else print(sorted(need - names)) or 1)
PY

# refused NAME PREFIX CHECKPOINT: exit 2, one line, no output directory
refused() {
  begin "refused: $1"
  rm -rf "$T/refused"
  $CKPT export "$3" --format hf "$T/refused" >"$T/out" 2>"$T/err"
  local rc=$?
  check [ $rc -eq 2 ] || fail "exit code $rc (expected 2): $(cat "$T/err")"
  check [ "$(wc -l <"$T/err")" -eq 1 ] || fail "expected one line on stderr: $(cat "$T/err")"
  check grep -q -F -- "$2" "$T/err" || fail "stderr: $(cat "$T/err") (expected '$2')"
  check [ ! -e "$T/refused" ] || fail "the output directory was written"
}
refused "MTP with a softmax gate (DeepSeek-V2 has none)" \
  "ckpt: export --format hf: mtp depth 1 with moe gate softmax: DeepSeek-V2 has no multi-token prediction" \
  "$T/softmax_mtp/ckpt/step_00000006.h5"
refused "a softmax gate with balance bias" "ckpt: export --format hf: moe gate softmax with balance bias" \
  "$T/softmax_bias/ckpt/step_00000006.h5"
refused "not a checkpoint" "ckpt: $CORPUS: not a readable HDF5 file" "$CORPUS"

begin "bad: an existing output directory is kept; --force replaces it"
before=$(snapshot "$T/hf_dense")
$CKPT export "$T/dense/ckpt/step_00000006.h5" --format hf "$T/hf_dense" >"$T/out" 2>"$T/err"
check [ $? -eq 2 ] || fail "exit code (expected 2)"
check grep -q "$T/hf_dense: exists (expected a new directory, or --force" "$T/err" || fail "$(cat "$T/err")"
check [ "$(snapshot "$T/hf_dense")" = "$before" ] || fail "the existing directory changed"
$CKPT export "$T/dense/ckpt/step_00000006.h5" --format hf "$T/hf_dense" --force >"$T/out" 2>"$T/err"
check [ $? -eq 0 ] || fail "--force: $(cat "$T/err")"
check cmp -s <(echo "$before") <(snapshot "$T/hf_dense") || fail "--force did not write the same export"

begin "bad: a tokenizer that is not there"
$CKPT export "$T/dense/ckpt/step_00000006.h5" --format hf "$T/refused" --tokenizer "$T/gone.model" >"$T/out" 2>"$T/err"
check [ $? -eq 2 ] || fail "exit code (expected 2)"
check grep -q "$T/gone.model: the tokenizer model is missing" "$T/err" || fail "$(cat "$T/err")"
check [ ! -e "$T/refused" ] || fail "the output directory was written"

begin "the h5 export keeps its own arguments"
$CKPT export "$T/dense/ckpt/step_00000006.h5" --format hf >"$T/out" 2>"$T/err"
check [ $? -eq 2 ] || fail "--format hf without OUT_DIR: exit code (expected 2)"
$CKPT export "$T/dense/ckpt/step_00000006.h5" "$T/x" >"$T/out" 2>"$T/err"
check [ $? -eq 2 ] || fail "an OUT_DIR without --format hf: exit code (expected 2)"

finish
