#!/usr/bin/env bash
# tools/ckpt export FILE --format hf OUT_DIR on the binary's own checkpoints of four small models:
# dense MHA (Llama), MLA with a query latent + MoE with the selection bias (sigmoid, 1 of 2 expert
# groups: noaux_tc) and the sequence-wise balance loss beside it (seq_aux) + MTP depth 2
# (DeepSeek-V3), MLA without a query latent + MoE with the auxiliary loss (softmax, 1 of 2 expert
# groups: group_limited_greedy) on every other layer (moe_layer_freq 2) + YaRN, its latent norms at
# 1e-6 and the others at 1e-5 (DeepSeek-V2), and dense MHA on SentencePiece shards (Llama and its
# tokenizer), and the shipped input/deepseek-tiny.deck with no flags. For each, tests/hf_read.py (the
# safetensors format from its definition, no tools/ckpt) maps the HF tensors back (bit for bit the
# checkpoint's /model), recomputes tools/torch_reference.py's loss from them, runs a forward of its
# own in the Hugging Face model code's conventions on the HF names and config.json keys, and
# compares with the trainer's own val_loss of the last step (rel 1e-5); and shows that each
# permutation matters. Then every refusal (a deck option with no HF counterpart), a missing
# tokenizer, bad input and an existing OUT_DIR: exit 2, one line, nothing written; and the h5
# export's command line still works.
# usage: hf_export.sh XUANXUE [MPIEXEC]
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
HERE="$(dirname "${BASH_SOURCE[0]}")"
CKPT="$HERE/../../tools/ckpt"
READ="$HERE/../hf_read.py"
PREP="$HERE/../../tools/prepare-data"
PY=/usr/bin/python3

CORPUS=$T/corpus.txt
make_corpus "$CORPUS"

# make_model_deck NAME STEPS LINES...: a deck training model NAME (its run directory $T/NAME) with
# the model lines given, on the bytes corpus; eval batches 2 of batch 2 at the end, a checkpoint there.
make_model_deck() {
  local name=$1 steps=$2
  shift 2
  {
    echo "seed 1"
    printf '%s\n' "$@"
    grep -q '^data ' <(printf '%s\n' "$@") || echo "data bytes $CORPUS valid 0.1 batch 2 workers 1"
    echo "optimizer adamw lr 1e-2"
    echo "output dir $T/$name log_every 1"
    echo "eval every 0 batches 2"
    echo "run $steps"
  } >"$T/$name.deck"
}
train() {  # train NAME STEPS LINES...
  local name=$1
  make_model_deck "$@"
  begin "train $name (setup)"
  expect_ok 1 -in "$T/$name.deck"
}
at_end() { ls "$T/$1"/ckpt/step_*.h5 | tail -1; }

MLA="norm_eps 1e-6 init_std 0.2"
train llama 4 "model dense vocab 256 dim 32 layers 2 heads 2 ffn 64 seq 16 init_std 0.2"
train v3 4 "model deepseek vocab 256 dim 32 layers 2 heads 2 ffn 64 seq 16 $MLA" \
  "attention mla kv_lora_rank 16 q_lora_rank 24 qk_nope_dim 8 rope_dim 8 v_dim 8" \
  "moe on dense_layers 1 shared 1 routed 4 topk 2 ffn 16 gate sigmoid balance bias balance_coef 0.02 seq_aux 0.01 route_scale 1.5" \
  "moe on groups 2 topk_groups 1" "mtp depth 2 weight 0.3"
# YaRN with a ramp inside rope_dim 8 (pairs 0 and 1 kept, 2 and 3 partly divided by 4), the tables
# times mscale(4, 1) / mscale(4, 0.8) and the scores times mscale(4, 0.8)^2
YARN="rope_scaling yarn factor 4 original_seq 4 beta_fast 0.1 beta_slow 0.01 mscale 1 mscale_all_dim 0.8"
train v2 4 "model deepseek vocab 256 dim 32 layers 2 heads 2 ffn 64 seq 16 rope_theta 100 norm_eps 1e-5 init_std 0.2" \
  "attention mla kv_lora_rank 16 q_lora_rank 0 qk_nope_dim 8 rope_dim 8 v_dim 8 latent_eps 1e-6" \
  "moe on dense_layers 1 shared 2 routed 4 topk 2 ffn 16 gate softmax balance aux balance_coef 0.01 route_scale 2" \
  "moe on dense_layers 0 groups 2 topk_groups 1 layer_freq 2" "$YARN"
begin "prepare SentencePiece shards (setup)"
check "$PREP" --tokenizer bpe --vocab 320 --out "$T/bpe" "$CORPUS" >"$T/prep.out" 2>&1 || fail "$(cat "$T/prep.out")"
train bpe 4 "model dense vocab 320 dim 32 layers 2 heads 2 ffn 64 seq 16 init_std 0.2" \
  "data shard '$T/bpe/train_*.bin' valid $T/bpe/val.bin tokenizer $T/bpe/tokenizer.model batch 2 workers 1"
[ "$FAILS" -eq 0 ] || finish

# ----------------------------------------------------------------------------
# the exports, read back independently

export_hf() {  # export_hf NAME [ARGS...]: $T/NAME.hf from NAME's last checkpoint; output in $T/out
  local name=$1
  shift
  $PY "$CKPT" export "$(at_end "$name")" --format hf "$T/$name.hf" "$@" >"$T/out" 2>"$T/err"
  local rc=$?
  check [ $rc -eq 0 ] || fail "export $name: exit code $rc: $(cat "$T/err")"
}
read_back() {  # read_back NAME DATA_ARGS...
  local name=$1
  shift
  check $PY "$READ" "$T/$name.hf" "$(at_end "$name")" "$T/$name/metrics.jsonl" "$@" --batch 2 --eval-batches 2 \
    >"$T/read.out" 2>&1 || fail "$(grep -E 'FAIL|Error|error' "$T/read.out" | head -5)"
  sed 's/^/    /' "$T/read.out" | grep -E 'val_loss|forward aux|without|bias changed|logits|^    (OK|FAILED)'
}

begin "llama: export, names, row permutation, loss"
export_hf llama
check grep -q "LlamaForCausalLM (model_type llama)" "$T/out" || fail "$(cat "$T/out")"
check grep -q "no tokenizer: the deck's data is byte-level" "$T/out" || fail "no word on the tokenizer: $(cat "$T/out")"
check [ ! -e "$T/llama.hf/tokenizer.model" ] || fail "a byte-level model got a tokenizer file"
check [ "$(ls "$T/llama.hf" | tr '\n' ' ')" = "config.json model.safetensors " ] || fail "files: $(ls "$T/llama.hf")"
read_back llama --bytes "$CORPUS" --valid 0.1

begin "deepseek-v3: MLA with q_lora, MoE sigmoid with the selection bias and seq_aux, 1 of 2 expert groups, MTP depth 2"
export_hf v3
check grep -q "DeepseekV3ForCausalLM (model_type deepseek_v3)" "$T/out" || fail "$(cat "$T/out")"
check grep -q '"num_nextn_predict_layers": 2' "$T/v3.hf/config.json" || fail "$(cat "$T/v3.hf/config.json")"
check grep -q '"n_group": 2,' "$T/v3.hf/config.json" && check grep -q '"topk_group": 1,' "$T/v3.hf/config.json" ||
  fail "groups: $(grep group "$T/v3.hf/config.json")"
check grep -q '"seq_aux": true' "$T/v3.hf/config.json" && check grep -q '"aux_loss_alpha": 0.01' "$T/v3.hf/config.json" ||
  fail "seq_aux 0.01: $(grep aux "$T/v3.hf/config.json")"
begin "v3: generate -logits (the decoder, on the GPU in tools/device/checks.sh) against the HF-convention forward"
check "$XX" generate -ckpt "$(at_end v3)" -prompt "The fox? " -tokens 1 -temperature 0 \
  -logits "$T/v3.logits" >"$T/gen.out" 2>&1 || fail "generate -logits: $(tail -3 "$T/gen.out")"
check [ "$(head -c 8 "$T/v3.logits")" = "# tokens" ] || fail "the logits file has no '# tokens' header"
read_back v3 --bytes "$CORPUS" --valid 0.1 --expect-bias --logits "$T/v3.logits"

begin "deepseek-v2: MLA without q_lora, MoE softmax with the auxiliary loss, group_limited_greedy, every other layer, YaRN, latent_eps 1e-6 under norm_eps 1e-5"
export_hf v2
check grep -q "DeepseekV2ForCausalLM (model_type deepseek_v2)" "$T/out" || fail "$(cat "$T/out")"
check grep -q '"aux_loss_alpha": 0.01' "$T/v2.hf/config.json" && check grep -q '"seq_aux": false' "$T/v2.hf/config.json" ||
  fail "aux_loss_alpha: $(grep aux "$T/v2.hf/config.json")"
check grep -q '"topk_method": "group_limited_greedy"' "$T/v2.hf/config.json" &&
  check grep -q '"moe_layer_freq": 2' "$T/v2.hf/config.json" ||
  fail "routing: $(grep -E 'group|freq' "$T/v2.hf/config.json")"
check $PY - "$T/v2.hf/config.json" <<'PY' || fail "rope_scaling or rms_norm_eps: $(cat "$T/v2.hf/config.json")"
import json, sys
c = json.load(open(sys.argv[1]))
sys.exit(0 if c["rope_scaling"] == {"type": "yarn", "rope_type": "yarn", "factor": 4.0,
                                    "original_max_position_embeddings": 4, "beta_fast": 0.1, "beta_slow": 0.01,
                                    "mscale": 1.0, "mscale_all_dim": 0.8}
         and c["rms_norm_eps"] == 1e-5 and c["max_position_embeddings"] == 16 else 1)
PY
read_back v2 --bytes "$CORPUS" --valid 0.1

# The issue that asked for faithful defaults: the shipped DeepSeek deck trained and exported as a new
# user would, with no flags (it once failed on its latent eps, then on MTP under a softmax gate).
begin "the shipped input/deepseek-tiny.deck (V3's choices): trained 3 steps, exported with no flags, read back"
SHIPPED="$HERE/../../input/deepseek-tiny.deck"
expect_ok 1 -in "$SHIPPED" -var data "$CORPUS" -var seq 16 -var steps 3 -var log_every 1 -var eval_every 3 \
  -var ckpt_every 3 -var run_dir "$T/shipped"
export_hf shipped
check grep -q "DeepseekV3ForCausalLM (model_type deepseek_v3)" "$T/out" || fail "$(cat "$T/out")"
check $PY - "$T/shipped.hf/config.json" <<'PY' || fail "not V3's choices: $(cat "$T/shipped.hf/config.json")"
import json, sys
c = json.load(open(sys.argv[1]))
want = {"scoring_func": "sigmoid", "topk_method": "noaux_tc", "n_group": 4, "topk_group": 2, "seq_aux": True,
        "aux_loss_alpha": 1e-4, "num_nextn_predict_layers": 1}
bad = {k: c.get(k) for k, v in want.items() if c.get(k) != v}
print(f"    config.json: {bad or 'as DeepSeek-V3 chooses'}")
sys.exit(1 if bad else 0)
PY
check $PY "$READ" "$T/shipped.hf" "$(at_end shipped)" "$T/shipped/metrics.jsonl" --bytes "$CORPUS" --valid 0.05 \
  --batch 8 --eval-batches 8 >"$T/read.out" 2>&1 || fail "$(grep -E 'FAIL|Error|error' "$T/read.out" | head -5)"
grep -E "trainer's val_loss" "$T/read.out" | sed 's/^/    /'

begin "tokenizer: the deck's SentencePiece model copied, tokenizer_config.json"
export_hf bpe
check cmp -s "$T/bpe/tokenizer.model" "$T/bpe.hf/tokenizer.model" || fail "tokenizer.model is not the deck's"
check $PY - "$T/bpe.hf" <<'PY' || fail "tokenizer_config.json or config.json's token ids"
import json, sys
t = json.load(open(sys.argv[1] + "/tokenizer_config.json"))
c = json.load(open(sys.argv[1] + "/config.json"))
sys.exit(0 if t["tokenizer_class"] == "LlamaTokenizer" and (t["unk_token"], t["bos_token"], t["eos_token"]) ==
         ("<unk>", "<s>", "</s>") and not t["add_bos_token"] and (c["bos_token_id"], c["eos_token_id"]) == (1, 2)
         else 1)
PY
read_back bpe --valid-shard "$T/bpe/val.bin"

begin "--rank 0 exports that rank's state (under sync dense, the same model)"
export_hf llama --rank 0 --force
check grep -q "rank 0" "$T/out" || fail "$(cat "$T/out")"
read_back llama --bytes "$CORPUS" --valid 0.1

# ----------------------------------------------------------------------------
# refusals: one line naming the deck option, exit 2, no OUT_DIR, no temp directory

expect_hf_error() {  # expect_hf_error WHAT FILE MESSAGE [ARGS...]
  local what=$1 file=$2 message=$3
  shift 3
  rm -rf "$T/refused"
  $PY "$CKPT" export "$file" --format hf "$T/refused" "$@" >"$T/out" 2>"$T/err"
  local rc=$?
  check [ $rc -eq 2 ] || fail "$what: exit code $rc (expected 2)"
  check [ "$(wc -l <"$T/err")" -eq 1 ] || fail "$what: expected one line on stderr: $(cat "$T/err")"
  check grep -q -F -- "$message" "$T/err" || fail "$what: $(cat "$T/err")"
  check [ ! -e "$T/refused" ] || fail "$what: OUT_DIR was created"
  check [ -z "$(ls -d "$T"/refused.* 2>/dev/null)" ] || fail "$what: a temp directory was left behind"
}
refused() {  # refused NAME OPTION MODEL_LINES...: trains one step, then the export is refused naming OPTION
  local name=$1 option=$2
  shift 2
  train "$name" 1 "$@"
  begin "refused: $option"
  expect_hf_error "$name" "$(at_end "$name")" "deck option '$option' has no Hugging Face counterpart"
}
DENSE="model dense vocab 256 dim 32 layers 2 heads 2 ffn 64 seq 16"
DEEP="model deepseek vocab 256 dim 32 layers 2 heads 2 ffn 64 seq 16"
ATT="attention mla kv_lora_rank 16 q_lora_rank 0 qk_nope_dim 8 rope_dim 8 v_dim 8"
refused mha_moe "moe on" "$DENSE" "moe on dense_layers 1 routed 4 topk 2 ffn 16"
refused mha_mtp "mtp depth 1" "$DENSE" "mtp depth 1"
refused mla_eps "model norm_eps 1e-05" "$DEEP" "$ATT"
check grep -qF "train with \`attention mla ... latent_eps 1e-6\`" "$T/err" ||
  fail "no word of latent_eps: $(cat "$T/err")"
refused mla_latent "attention mla latent_eps 1e-05" "$DEEP" "$ATT latent_eps 1e-5"
refused llama_yarn "rope_scaling yarn mscale_all_dim 1" "$DENSE" \
  "rope_scaling yarn factor 4 original_seq 8 mscale_all_dim 1"
begin "--latent-eps-1e-6 exports it anyway, and says what changes"
$PY "$CKPT" export "$(at_end mla_eps)" --format hf "$T/mla_eps.hf" --latent-eps-1e-6 >"$T/out" 2>&1 ||
  fail "$(cat "$T/out")"
check grep -q "q_a_layernorm and kv_a_layernorm will use eps 1e-6, not the trained 1e-05" "$T/out" || fail "$(cat "$T/out")"
check grep -q '"rms_norm_eps": 1e-05' "$T/mla_eps.hf/config.json" || fail "rms_norm_eps: $(grep eps "$T/mla_eps.hf/config.json")"
refused softmax_bias "moe gate softmax balance bias" "$DEEP norm_eps 1e-6" "$ATT" \
  "moe on dense_layers 1 routed 4 topk 2 ffn 16 gate softmax balance bias"
refused softmax_mtp "mtp depth 1" "$DEEP norm_eps 1e-6" "$ATT" "moe on dense_layers 1 routed 4 topk 2 ffn 16" "mtp depth 1"
refused sigmoid_top1 "moe topk 1 gate sigmoid" "$DEEP norm_eps 1e-6" "$ATT" \
  "moe on dense_layers 1 routed 4 topk 1 ffn 16 gate sigmoid balance bias"

begin "a tokenizer the deck names but that is missing: exit 2 naming it; --tokenizer gives it"
mv "$T/bpe/tokenizer.model" "$T/moved.model"
expect_hf_error "missing tokenizer" "$(at_end bpe)" "the tokenizer '$T/bpe/tokenizer.model' named by the deck's data line is missing"
$PY "$CKPT" export "$(at_end bpe)" --format hf "$T/bpe2.hf" --tokenizer "$T/moved.model" >"$T/out" 2>&1 ||
  fail "--tokenizer: $(cat "$T/out")"
check cmp -s "$T/moved.model" "$T/bpe2.hf/tokenizer.model" || fail "--tokenizer: not copied"
expect_hf_error "a tokenizer of another vocab" "$(at_end llama)" "has 320 pieces, but the model has vocab 256" \
  --tokenizer "$T/moved.model"
mv "$T/moved.model" "$T/bpe/tokenizer.model"

begin "bad input: not a checkpoint"
printf 'not hdf5' >"$T/junk.h5"
expect_hf_error "junk" "$T/junk.h5" "$T/junk.h5: not a readable HDF5 file"

begin "an existing OUT_DIR: refused when not empty (untouched), replaced with --force, fine when empty"
mkdir -p "$T/keep"
echo precious >"$T/keep/notes.txt"
before=$(snapshot "$T/keep")
$PY "$CKPT" export "$(at_end llama)" --format hf "$T/keep" >"$T/out" 2>"$T/err"
rc=$?
check [ $rc -eq 2 ] || fail "exit code $rc (expected 2)"
check grep -q -F "$T/keep: exists and is not empty (expected a new or empty directory; --force replaces it)" "$T/err" ||
  fail "$(cat "$T/err")"
check [ "$(snapshot "$T/keep")" = "$before" ] || fail "the directory changed"
$PY "$CKPT" export "$(at_end llama)" --format hf "$T/keep" --force >"$T/out" 2>&1 || fail "--force: $(cat "$T/out")"
check [ ! -e "$T/keep/notes.txt" ] && check [ -s "$T/keep/model.safetensors" ] || fail "--force did not replace it"
check [ -z "$(ls -d "$T"/keep.* 2>/dev/null)" ] || fail "--force left $(ls -d "$T"/keep.*)"
mkdir "$T/empty"
$PY "$CKPT" export "$(at_end llama)" --format hf "$T/empty" >"$T/out" 2>&1 || fail "empty OUT_DIR: $(cat "$T/out")"
check [ -s "$T/empty/config.json" ] || fail "nothing in the empty OUT_DIR"

begin "the command line: h5 stays the default; each format refuses the other's arguments"
$PY "$CKPT" export "$(at_end llama)" --rank 0 -o "$T/r0.h5" >"$T/out" 2>&1 || fail "h5 export: $(cat "$T/out")"
check $PY "$CKPT" verify "$T/r0.h5" >"$T/out" 2>&1 || fail "$(cat "$T/out")"
for args in "--format hf" "--format h5 --rank 0 $T/dir" "--format hf $T/dir -o $T/x.h5" "--rank 0" \
            "--rank 0 -o $T/x.h5 --latent-eps-1e-6"; do
  $PY "$CKPT" export "$(at_end llama)" $args >"$T/out" 2>"$T/err"
  rc=$?
  check [ $rc -eq 2 ] || fail "'export FILE $args': exit code $rc (expected 2)"
  check grep -q "error: " "$T/err" || fail "'export FILE $args': $(cat "$T/err")"
done
check [ ! -e "$T/dir" ] && check [ ! -e "$T/x.h5" ] || fail "a refused command line wrote something"
finish
