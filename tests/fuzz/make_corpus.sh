#!/usr/bin/env bash
# Seeds for fuzzing the checkpoint reader: real checkpoints of tiny runs of
# the model tests/fuzz/fuzz_checkpoint.cpp reads (dense, vocab 256, dim 8,
# 1 layer, seq 16), each kind a resume meets:
#   dense        1 rank, base files, no per-rank state
#   local_full   2 ranks, sync local 2: /ranks/<r> as they are, writer rank0
#   local_int8   2 ranks, sync local 2, mode diff int8, base_every 2: a chain
#                (step 1 base, step 2 delta, step 3 base)
#   local_topk   2 ranks, sync local 2, mode diff topk, lossless delta deltas
#   sharded      2 ranks, shard optimizer: written by slabs (rank_tensors = base)
#   moments_bf16 2 ranks, shard optimizer, moments bf16: uint16 moments (encoding bfloat16)
# Writes OUT/RUN/ckpt/step_*.h5 (the runs as they are, a delta next to its
# base) and OUT/seeds/RUN-step_N.h5 (copies, for libFuzzer's corpus);
# OUT/chain_base names the chain base the deltas in seeds/ need.
# With spm_train (Debian: sentencepiece), also OUT/tokenizer/*.model: the
# SentencePiece models fuzz_tokenizer starts from (BPE as tools/prepare-data
# trains it: byte fallback, identity normalization, no dummy prefix; and a
# unigram one), 5 KB each.
# About 30 s on 2 cores; the files are 60-150 KB each.
# usage: make_corpus.sh OUT XUANXUE [MPIEXEC]
set -euo pipefail
out=${1:?usage: make_corpus.sh OUT XUANXUE [MPIEXEC]}
xx=$(realpath "${2:?usage: make_corpus.sh OUT XUANXUE [MPIEXEC]}")
mpiexec=${3:-mpiexec}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
mkdir -p "$out/seeds"
out=$(realpath "$out")
for ((i = 1; i <= 150; ++i)); do
  printf 'Line %d: the quick brown fox jumps over the lazy dog, again.\n' "$i"
done >"$out/corpus.txt"

# train NAME NP LINES...: 3 steps of the fixed model with the deck lines LINES.
train() {
  local name=$1 np=$2 run=$out/$1
  shift 2
  rm -rf "$run"
  mkdir -p "$run"
  {
    echo "seed 1"
    echo "model dense vocab 256 dim 8 layers 1 heads 2 ffn 16 seq 16"
    echo "data bytes $out/corpus.txt valid 0.1 batch 2 workers 1"
    echo "peak_gflops 50"
    echo "output dir $run log_every 1"
    echo "eval every 0 batches 1"
    printf '%s\n' "$@"
    echo "run 3"
  } >"$run.deck"
  if [ "$np" -eq 1 ]; then
    timeout 120 "$xx" -in "$run.deck" >"$run.log" 2>&1
  else
    timeout 120 "$mpiexec" --oversubscribe --bind-to none -n "$np" "$xx" -in "$run.deck" >"$run.log" 2>&1
  fi || { echo "make_corpus: the $name run failed (log: $run.log)" >&2; tail -5 "$run.log" >&2; exit 1; }
  local f
  for f in "$run"/ckpt/step_*.h5; do
    cp "$f" "$out/seeds/$name-$(basename "$f")"
  done
}

train dense 1 "checkpoint every 2"
train local_full 2 "sync local 2" "checkpoint every 1 mode full writer rank0"
train local_int8 2 "sync local 2" "checkpoint every 1 mode diff codec int8 base_every 2"
train local_topk 2 "sync local 2" "checkpoint every 2 mode diff codec topk ratio 0.1"
train sharded 2 "shard optimizer" "checkpoint every 2"
train moments_bf16 2 "shard optimizer" "optimizer adamw lr 1e-3 moments bf16" "checkpoint every 2"
echo "$out/local_int8/ckpt/step_00000001.h5" >"$out/chain_base"
if command -v spm_train >/dev/null; then
  mkdir -p "$out/tokenizer"
  for type in bpe unigram; do
    spm_train --input="$out/corpus.txt" --model_prefix="$out/tokenizer/$type" --vocab_size=300 --model_type=$type \
      --byte_fallback=true --normalization_rule_name=identity --add_dummy_prefix=false --minloglevel=2 \
      >"$out/tokenizer/$type.log" 2>&1 || { echo "make_corpus: spm_train $type failed" >&2; exit 1; }
    rm -f "$out/tokenizer/$type.vocab" "$out/tokenizer/$type.log"
  done
fi
echo "make_corpus: $(ls "$out/seeds" | wc -l) seeds in $out/seeds ($(du -sk "$out/seeds" | cut -f1) KB)"
