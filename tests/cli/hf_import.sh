#!/usr/bin/env bash
# `init hf DIR` (src/hf/config.h, src/hf/import.h) on Hugging Face directories written by
# `tools/ckpt export --format hf` from the binary's own checkpoints of three small models: Llama
# (dense MHA; q/k rows permuted), DeepSeek-V3-shaped (MLA with a query latent, MoE with the sigmoid
# gate, its selection bias over 2 expert groups of which 1 is kept and the sequence-wise balance loss
# beside it (seq_aux), MTP depth 2; eh_proj halves swapped) and DeepSeek-V2-shaped (MLA, MoE with the
# softmax gate and the auxiliary loss per sequence (seq_aux), group_limited_greedy, MoE on every
# other layer, YaRN, latent norms at 1e-6 and the others at 1e-5: rope_scaling and rms_norm_eps read
# back). For each:
#   - the imported model's validation loss before its first step equals the exporting run's last one
#     exactly (the same weights, the same windows);
#   - export -> import -> export: config.json and every tensor identical (tests/hf_files.py same);
#     V2's re-export read by tests/hf_read.py: its balance loss per sequence in HF's conventions is ours;
#   - the V3 one at 2 ranks under ep 2 + shard optimizer, and at 4 under ep 2 + shard params, reads
#     only its own experts and pieces and gives the same loss and the same step-0 checkpoint; so does
#     it in 2 pipeline stages at 2 ranks, and at 4 under ep 2 + shard optimizer (each stage its layers);
#     v3_tied too (the last stage reads the embedding as its head);
#   - -resume auto wins over init once the run has its own checkpoint.
# Then FP8: the V3 directory converted to float8_e4m3fn with 8x8 weight_scale_inv blocks (and bf16
# elsewhere) imports as the dequantized values bit for bit, and tests/hf_read.py's HF-convention
# forward on what was imported gives the trainer's loss (rel 1e-5). Then every refusal of a config.json
# key by name and line, a deck line contradicting config.json, a model line above the init, and bad
# safetensors: exit 2, one line, nothing trained.
# usage: hf_import.sh XUANXUE [MPIEXEC]
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
HERE="$(dirname "${BASH_SOURCE[0]}")"
CKPT="$HERE/../../tools/ckpt"
FILES="$HERE/../hf_files.py"
READ="$HERE/../hf_read.py"
PY=/usr/bin/python3

CORPUS=$T/corpus.txt
make_corpus "$CORPUS"
DATA="data bytes $CORPUS valid 0.1 batch 2 workers 1"

# deck NAME LINES...: $T/NAME.deck, training on the corpus (unless a data line is given) into
# $T/NAME, validating and writing a checkpoint every step (under init hf also at step 0); the
# lines in order (the init and model lines on lines 2 on), the run line last.
deck() {
  local name=$1
  shift
  {
    echo "seed 1"
    printf '%s\n' "$@" | grep -v '^run '
    grep -q '^data ' <(printf '%s\n' "$@") || echo "$DATA"
    echo "optimizer adamw lr 1e-2"
    echo "output dir $T/$name log_every 1"
    echo "eval every 1 batches 2"
    echo "checkpoint every 1"
    printf '%s\n' "$@" | grep '^run '
  } >"$T/$name.deck"
}
val_at() {  # val_at RUN STEP: val_loss of STEP in RUN's metrics.jsonl, as written
  $PY -c 'import json,sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    if r["step"] == int(sys.argv[2]) and "val_loss" in r: print(repr(r["val_loss"]))' "$T/$1/metrics.jsonl" "$2"
}
export_hf() {  # export_hf CHECKPOINT OUT_DIR
  $PY "$CKPT" export "$1" --format hf "$2" >"$T/exp.out" 2>&1 || fail "export $1: $(cat "$T/exp.out")"
}
step_file() { printf '%s/ckpt/step_%08d.h5' "$T/$1" "$2"; }

MLA="norm_eps 1e-6 init_std 0.2"
declare -A MODEL
MODEL[llama]="model dense vocab 256 dim 32 layers 2 heads 2 ffn 64 seq 16 init_std 0.2
run 4"
MODEL[v3]="model deepseek vocab 256 dim 32 layers 2 heads 2 ffn 64 seq 16 $MLA
attention mla kv_lora_rank 16 q_lora_rank 24 qk_nope_dim 8 rope_dim 8 v_dim 8
moe on dense_layers 1 shared 1 routed 4 topk 2 ffn 16 gate sigmoid balance bias balance_coef 0.02 seq_aux 0.01 route_scale 1.5
moe on groups 2 topk_groups 1
mtp depth 2 weight 0.3
run 4"
MODEL[v2]="model deepseek vocab 256 dim 32 layers 2 heads 2 ffn 64 seq 16 rope_theta 100 norm_eps 1e-5 init_std 0.2
attention mla kv_lora_rank 16 q_lora_rank 0 qk_nope_dim 8 rope_dim 8 v_dim 8 latent_eps 1e-6
moe on dense_layers 1 shared 2 routed 4 topk 2 ffn 16 gate softmax balance aux balance_coef 0.01 aux_scope sequence route_scale 2
moe on dense_layers 0 groups 2 topk_groups 1 layer_freq 2
rope_scaling yarn factor 4 original_seq 4 beta_fast 0.1 beta_slow 0.01 mscale 1 mscale_all_dim 0.8
run 4"
# Tied embeddings: 'embed' is the head (tie_word_embeddings true, no lm_head.weight); V3's MTP depth shares it.
MODEL[llama_tied]="model dense vocab 256 dim 32 layers 2 heads 2 ffn 64 seq 16 init_std 0.2 tie_embeddings yes
run 4"
MODEL[v3_tied]="model deepseek vocab 256 dim 32 layers 2 heads 2 ffn 64 seq 16 $MLA tie_embeddings yes
attention mla kv_lora_rank 16 q_lora_rank 24 qk_nope_dim 8 rope_dim 8 v_dim 8
moe on dense_layers 1 shared 1 routed 4 topk 2 ffn 16 gate sigmoid balance bias balance_coef 0.02
mtp depth 1 weight 0.3
run 4"

for name in llama v3 v2 llama_tied v3_tied; do
  begin "$name: train 4 steps, export"
  deck "$name" "${MODEL[$name]}"
  expect_ok 1 -in "$T/$name.deck"
  export_hf "$(step_file "$name" 4)" "$T/$name.hf"

  begin "$name: init hf: the loss before the first step is the exporting run's last, exactly"
  deck "$name.imp" "init hf $T/$name.hf" "run 1"
  expect_ok 1 -in "$T/$name.imp.deck"
  check grep -q "init hf $T/$name.hf: .* tensors" "$T/out" || fail "no init hf line: $(head -40 "$T/out")"
  check grep -q "^init hf $T/$name.hf expanded yes" "$T/out" || fail "the resolved deck lacks the init line"
  tie=no && [[ $name == *_tied ]] && tie=yes
  check grep -q "^model .* tie_embeddings $tie\$" "$T/out" || fail "model line: $(grep '^model' "$T/out")"
  check grep -q "\"tie_word_embeddings\": $([ $tie = yes ] && echo true || echo false)" "$T/$name.hf/config.json" ||
    fail "config.json: $(grep tie_word "$T/$name.hf/config.json")"
  lm_head=$($PY -c 'import sys; sys.path.insert(0, sys.argv[1]); import hf_files
print("lm_head.weight" in hf_files.read(sys.argv[2]))' "$HERE/.." "$T/$name.hf/model.safetensors")
  check [ "$lm_head" = "$([ $tie = yes ] && echo False || echo True)" ] || fail "lm_head.weight written: $lm_head"
  if [ "$name" = v2 ]; then
    yarn="rope_scaling yarn factor 4 original_seq 4 beta_fast 0.1 beta_slow 0.01 mscale 1 mscale_all_dim 0.8"
    check grep -q "^$yarn\$" "$T/out" || fail "no rope_scaling line: $(grep -i rope "$T/out")"
    check grep -q "^attention mla .* latent_eps 1e-06$" "$T/out" || fail "no latent_eps: $(grep '^attention' "$T/out")"
  fi
  want=$(val_at "$name" 4) got=$(val_at "$name.imp" 0)
  check [ -n "$want" ] && check [ "$want" = "$got" ] || fail "val_loss at step 0 $got, the exporting run's $want"
  echo "    val_loss $got (exporting run at step 4: $want)"

  begin "$name: export -> import -> export: identical config.json and tensors"
  export_hf "$(step_file "$name.imp" 0)" "$T/$name.hf2"
  check $PY "$FILES" same "$T/$name.hf" "$T/$name.hf2" >"$T/same.out" 2>&1 || fail "$(cat "$T/same.out")"
  sed 's/^/    /' "$T/same.out"
done

begin "v2: the re-export's balance loss per sequence (seq_aux) in HF's conventions is torch_reference's"
check grep -q '"seq_aux": true' "$T/v2.hf2/config.json" || fail "$(grep seq_aux "$T/v2.hf2/config.json")"
head -1 "$T/v2.imp/metrics.jsonl" >"$T/step0.jsonl"  # the step-0 validation record
check $PY "$READ" "$T/v2.hf2" "$(step_file v2.imp 0)" "$T/step0.jsonl" --bytes "$CORPUS" --valid 0.1 \
  --batch 2 --eval-batches 2 >"$T/read.out" 2>&1 || fail "$(grep -E 'FAIL|rror' "$T/read.out" | head -5)"
grep -E 'forward aux|sequences|^(OK|FAILED)' "$T/read.out" | sed 's/^/    /'

begin "v3_tied: the HF-convention forward (embed_tokens as the head) gives the trainer's loss and generate's logits"
check "$XX" generate -ckpt "$(step_file v3_tied.imp 0)" -prompt "The fox? " -tokens 1 -temperature 0 \
  -logits "$T/v3_tied.logits" >"$T/gen.out" 2>&1 || fail "generate -logits: $(tail -3 "$T/gen.out")"
head -1 "$T/v3_tied.imp/metrics.jsonl" >"$T/step0.jsonl"
check $PY "$READ" "$T/v3_tied.hf2" "$(step_file v3_tied.imp 0)" "$T/step0.jsonl" --bytes "$CORPUS" --valid 0.1 \
  --batch 2 --eval-batches 2 --logits "$T/v3_tied.logits" >"$T/read.out" 2>&1 ||
  fail "$(grep -E 'FAIL|rror' "$T/read.out" | head -5)"
grep -E 'lm_head|val_loss|logits|^(OK|FAILED)' "$T/read.out" | sed 's/^/    /'

begin "llama_tied: an lm_head.weight equal to embed_tokens is read as the one tensor; one that differs is refused"
rm -rf "$T/tied.hf" && cp -r "$T/llama_tied.hf" "$T/tied.hf"
$PY "$FILES" add-head "$T/tied.hf" same
deck tied.same "init hf $T/tied.hf" "run 1"
expect_ok 1 -in "$T/tied.same.deck"
want=$(val_at llama_tied 4) got=$(val_at tied.same 0)
check [ "$want" = "$got" ] || fail "val_loss at step 0 $got, the exporting run's $want"
rm -rf "$T/tied.hf" && cp -r "$T/llama_tied.hf" "$T/tied.hf"
$PY "$FILES" add-head "$T/tied.hf" other
deck bad "init hf $T/tied.hf" "run 1"
expect_bad 2 "$T/tied.hf/model.safetensors: tensor 'lm_head.weight' differs from 'model.embed_tokens.weight' in row 255" \
  "(expected tie_word_embeddings true to mean one tensor" -- -in "$T/bad.deck"
begin "tied: a deck line untying an import that ties, and an untied config.json over tied weights, are refused"
deck bad "init hf $T/llama_tied.hf" "model dense tie_embeddings no" "run 1"
expect_bad 1 "$T/bad.deck:3:" "tie_embeddings" -- -in "$T/bad.deck"
rm -rf "$T/tied.hf" && cp -r "$T/llama_tied.hf" "$T/tied.hf"
$PY "$FILES" edit "$T/tied.hf" 'tie_word_embeddings=false'
deck bad "init hf $T/tied.hf" "run 1"
expect_bad 2 "$T/tied.hf/model.safetensors" "lm_head.weight" -- -in "$T/bad.deck"

begin "v3 at 2 ranks (ep 2, shard optimizer) and 4 (ep 2, shard params): the same step-0 checkpoint"
for spec in "2 optimizer" "4 params"; do
  read -r np level <<<"$spec"
  deck "v3.np$np" "init hf $T/v3.hf" "moe on ep 2" "shard $level" "run 1"
  expect_ok "$np" -in "$T/v3.np$np.deck"
  check [ -n "$(val_at "v3.np$np" 0)" ] || fail "np $np: no validation at step 0"
  export_hf "$(step_file "v3.np$np" 0)" "$T/v3.np$np.hf"
  check $PY "$FILES" same "$T/v3.hf" "$T/v3.np$np.hf" >"$T/same.out" 2>&1 || fail "np $np: $(cat "$T/same.out")"
done

begin "v3 in 2 pipeline stages at 2 ranks, and at 4 under ep 2 + shard optimizer; v3_tied too: each stage reads its own layers (a tied head's last stage the embedding too)"
for spec in "v3 2" "v3 4" "v3_tied 2"; do
  read -r name np <<<"$spec"
  extra=("pipeline stages 2 micro 2")
  [ "$np" = 4 ] && extra=("moe on ep 2" "shard optimizer" "pipeline stages 2 micro 2")
  deck "$name.pp$np" "init hf $T/$name.hf" "${extra[@]}" "run 1"
  expect_ok "$np" -in "$T/$name.pp$np.deck"
  check [ -n "$(val_at "$name.pp$np" 0)" ] || fail "$name np $np: no validation at step 0"
  export_hf "$(step_file "$name.pp$np" 0)" "$T/$name.pp$np.hf"
  check $PY "$FILES" same "$T/$name.hf" "$T/$name.pp$np.hf" >"$T/same.out" 2>&1 || fail "$name np $np: $(cat "$T/same.out")"
done

begin "-resume auto: the run's own checkpoint wins over init"
expect_ok 1 -in "$T/v3.imp.deck" -resume auto
check grep -q "resumed from .*step_00000001.h5 at step 1" "$T/out" || fail "$(grep -i resum "$T/out")"
refute grep -q "^init hf .*tensors" "$T/out" || fail "it read the HF files again"

begin "FP8: e4m3fn weights with 8x8 weight_scale_inv blocks, bf16 elsewhere, dequantized on import"
check $PY "$FILES" fp8 "$T/v3.hf" "$T/v3.fp8" 8 8 >"$T/fp8.out" 2>&1 || fail "$(cat "$T/fp8.out")"
deck v3.fp8.imp "init hf $T/v3.fp8" "run 1"
expect_ok 1 -in "$T/v3.fp8.imp.deck"
check grep -q "FP8 dequantized with 8x8 weight_scale_inv blocks" "$T/out" || fail "$(grep 'init hf' "$T/out")"
export_hf "$(step_file v3.fp8.imp 0)" "$T/v3.fp8.back"
check $PY "$FILES" dequantized "$T/v3.fp8" "$T/v3.fp8.back" >"$T/deq.out" 2>&1 || fail "$(cat "$T/deq.out")"
sed 's/^/    /' "$T/deq.out"
head -1 "$T/v3.fp8.imp/metrics.jsonl" >"$T/step0.jsonl"  # the step-0 validation record
check $PY "$READ" "$T/v3.fp8.back" "$(step_file v3.fp8.imp 0)" "$T/step0.jsonl" --bytes "$CORPUS" --valid 0.1 \
  --batch 2 --eval-batches 2 --expect-bias >"$T/read.out" 2>&1 || fail "$(grep -E 'FAIL|rror' "$T/read.out" | head -5)"
grep -E 'val_loss|^(OK|FAILED)' "$T/read.out" | sed 's/^/    /'

begin "input/finetune-hf.deck: a published model with its tokenizer.json, the user's text, 2 ranks under ep 2"
TOK="$HERE/../data/hf_tokenizer/tokenizer.json"
check "$HERE/../../tools/prepare-data" --tokenizer "$TOK" --valid 0.3 --out "$T/ft.data" "$CORPUS" >"$T/prep.out" 2>&1 ||
  fail "prepare-data: $(cat "$T/prep.out")"
deck pub "model deepseek vocab 1059 dim 32 layers 2 heads 2 ffn 64 seq 16 $MLA" \
  "attention mla kv_lora_rank 16 q_lora_rank 24 qk_nope_dim 8 rope_dim 8 v_dim 8" \
  "moe on dense_layers 1 shared 1 routed 4 topk 2 ffn 16 gate sigmoid balance bias" "mtp depth 1" \
  "data shard $T/ft.data/train_*.bin valid $T/ft.data/val.bin tokenizer $TOK batch 2 workers 1" "run 2"
expect_ok 1 -in "$T/pub.deck"
export_hf "$(step_file pub 2)" "$T/pub.hf"
check cmp -s "$TOK" "$T/pub.hf/tokenizer.json" || fail "the export did not copy tokenizer.json"
expect_ok 2 -in "$HERE/../../input/finetune-hf.deck" -var model "$T/pub.hf" -var data "$T/ft.data" -var seq 16 \
  -var batch 2 -var steps 3 -var ep 2 -var run_dir "$T/ft" -var eval_every 1 -var ckpt_every 3 -resume auto
check grep -q "^step  *0/3 | val_loss" "$T/out" || fail "no validation before the first step: $(grep val_ "$T/out")"
check [ -f "$(step_file ft 0)" ] && check [ -f "$(step_file ft 3)" ] || fail "checkpoints: $(ls "$T/ft/ckpt")"
$PY "$CKPT" export "$T/ft" --format hf "$T/ft.hf" >"$T/exp.out" 2>&1 || fail "export: $(cat "$T/exp.out")"
check cmp -s "$TOK" "$T/ft.hf/tokenizer.json" || fail "the fine-tune's export lacks the tokenizer: $(cat "$T/exp.out")"
check grep -q "byte-level BPE" "$T/exp.out" || fail "$(cat "$T/exp.out")"

# ----------------------------------------------------------------------------
# refusals: exit 2, one line naming config.json's line and key (or the deck's line), nothing trained

refused_key() {  # refused_key WHAT SOURCE PREFIX HINT EDITS...: a copy of SOURCE with config.json edited
  local what=$1 source=$2 prefix=$3 hint=$4
  shift 4
  begin "refused: $what"
  rm -rf "$T/bad.hf" && cp -r "$T/$source.hf" "$T/bad.hf"
  $PY "$FILES" edit "$T/bad.hf" "$@"
  deck bad "init hf $T/bad.hf" "run 1"
  local line
  line=$(grep -n "\"${prefix}\"" "$T/bad.hf/config.json" | head -1 | cut -d: -f1)
  expect_bad 1 "$T/bad.hf/config.json:${line:-1}: " "$hint" -- -in "$T/bad.deck"
  expect_absent "$T/bad/ckpt" "a refused import wrote a checkpoint"
}
refused_key "another rope type" v3 rope_scaling "rope type 'linear': not built" \
  'rope_scaling={"type": "linear", "factor": 2}'
refused_key "YaRN unrounded" v2 rope_scaling "'truncate': false" \
  'rope_scaling={"type": "yarn", "factor": 4, "original_max_position_embeddings": 4, "truncate": false}'
refused_key "expert groups that do not divide the experts" v3 n_group "n_group 3 does not divide n_routed_experts 4" \
  'n_group=3'
refused_key "tie_word_embeddings not a boolean" llama tie_word_embeddings "'tie_word_embeddings' is 1 (expected true or false)" \
  'tie_word_embeddings=1'
refused_key "an unknown key" llama sliding_window "key 'sliding_window' is not one xuanxue reads" \
  'sliding_window=4096'
refused_key "another architecture" llama model_type "model_type 'mistral'" 'model_type="mistral"'
refused_key "grouped keys and values" llama num_key_value_heads "grouped keys and values are not built" \
  'num_key_value_heads=1'
refused_key "moe_layer_freq 0" v2 moe_layer_freq "'moe_layer_freq' is 0 (expected an integer >= 1)" 'moe_layer_freq=0'
refused_key "a missing size" llama hidden_size "'hidden_size' is missing" 'hidden_size='
refused_key "a size of the wrong type" llama hidden_size "'hidden_size' is \"32\"" 'hidden_size="32"'

begin "refused: a deck line contradicting config.json"
deck bad "init hf $T/v2.hf" "moe on routed 8 ep 1" "run 1"
expect_bad 1 "$T/bad.deck:3: moe routed 8 contradicts $T/v2.hf/config.json's n_routed_experts" -- -in "$T/bad.deck"
deck bad "init hf $T/v2.hf" "moe off" "run 1"
expect_bad 1 "$T/bad.deck:3: 'moe off' changes the moe config.json describes" -- -in "$T/bad.deck"
begin "refused: a model line above init hf"
deck bad "model dense vocab 256 dim 32 layers 2 heads 2 ffn 64 seq 16" "init hf $T/llama.hf" "run 1"
expect_bad 1 "$T/bad.deck:3: init hf after 'model' ($T/bad.deck:2)" -- -in "$T/bad.deck"
begin "refused: init hf without config.json"
deck bad "init hf $T/nowhere" "run 1"
expect_bad 1 "$T/bad.deck:2: cannot read $T/nowhere/config.json" -- -in "$T/bad.deck"

begin "refused: safetensors that are not config.json's model"
rm -rf "$T/bad.hf" && cp -r "$T/v2.hf" "$T/bad.hf"
$PY "$FILES" edit "$T/bad.hf" 'moe_intermediate_size=8'
deck bad "init hf $T/bad.hf" "run 1"
expect_bad 2 "$T/bad.hf/model.safetensors: tensor 'model.layers.0.mlp.shared_experts.gate_proj.weight' has shape [32, 32]" \
  "(expected [16, 32]" -- -in "$T/bad.deck"
rm -rf "$T/bad.hf" && mkdir "$T/bad.hf" && cp "$T/v2.hf/config.json" "$T/bad.hf/"
head -c 100 "$T/v2.hf/model.safetensors" >"$T/bad.hf/model.safetensors"
expect_bad 2 "$T/bad.hf/model.safetensors: offset 0: header length" -- -in "$T/bad.deck"

finish
