#!/usr/bin/env bash
# Real text end to end: tools/prepare-data trains a SentencePiece BPE model
# and writes shards; xuanxue trains on them at 2 ranks with validation bits
# per byte and samples (which change nothing in the curve); `xuanxue
# generate` continues a prompt from the checkpoint, the same text for the
# same seed. Bad input, each exit 2 with one message: shards of another
# tokenizer, a model vocab that is not the tokenizer's, a file that is not a
# tokenizer, a sample prompt longer than seq, a generate prompt longer than
# seq, a checkpoint whose vocab is not the tokenizer's.
# usage: bpe.sh XUANXUE [MPIEXEC]
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PREP="$ROOT/tools/prepare-data"
F=/usr/share/games/fortunes

cat "$F/fortunes" "$F/literature" "$F/riddles" >"$T/a.txt" 2>/dev/null || cat "$F"/[a-m]* >"$T/a.txt"
cat "$F/science" "$F/wisdom" "$F/people" >"$T/b.txt" 2>/dev/null || cat "$F"/[n-z]* >"$T/b.txt"

begin "prepare: BPE model and shards (setup)"
check "$PREP" --tokenizer bpe --vocab 512 --out "$T/bpe" "$T/a.txt" >"$T/prep.out" 2>&1 || fail "prepare-data: $(cat "$T/prep.out")"
check "$PREP" --tokenizer bpe --vocab 512 --out "$T/other" "$T/b.txt" >"$T/prep.out" 2>&1 || fail "prepare-data (other): $(cat "$T/prep.out")"
check "$PREP" --tokenizer bpe --vocab 600 --out "$T/v600" "$T/b.txt" >"$T/prep.out" 2>&1 || fail "prepare-data (600): $(cat "$T/prep.out")"
check [ -s "$T/bpe/tokenizer.model" ] && check [ -s "$T/bpe/val.bin" ] && check [ -s "$T/bpe/train_0000.bin" ] ||
  fail "prepare-data wrote $(ls "$T/bpe" 2>&1)"
[ "$FAILS" -eq 0 ] || finish

RUN=$T/run
DECK=$T/bpe.deck
cat >"$DECK" <<EOT
variable steps 4
variable sample 2
variable vocab 512
variable tok $T/bpe/tokenizer.model
variable prompt "The "
seed 1
model dense vocab \${vocab} dim 32 layers 1 heads 2 ffn 64 seq 32
data shard '$T/bpe/train_*.bin' valid $T/bpe/val.bin tokenizer \${tok} batch 2 workers 1
output dir \${run} log_every 1
eval every 2 batches 2
sample every \${sample} prompt '\${prompt}' tokens 12
checkpoint every 4
run \${steps}
EOT

begin "train 4 steps on 2 ranks: bits per byte, samples on the console, in the log"
expect_ok 2 -in "$DECK" -var run "$RUN"
check grep -q '"val_bpb"' "$RUN/metrics.jsonl" || fail "no val_bpb in metrics.jsonl"
check grep -q -E 'val_loss [0-9.]+ \| val_ppl [0-9.]+ \| val_bpb [0-9.]+' "$T/out" || fail "no val_bpb on the step line"
check [ "$(grep -c -E '^step +[24] \| sample \(12 tokens' "$T/out")" -eq 2 ] || fail "expected samples at steps 2 and 4"
check grep -q -E 'sample \(12 tokens' "$RUN/rank0/log.txt" || fail "no sample in rank 0's log"
check grep -q "tokenizer sentencepiece: $T/bpe/tokenizer.model, vocab 512" "$T/out" || fail "start-up does not name the tokenizer"
# bits per byte, recomputed: nats per token * tokens / bytes / ln 2 is at least plausible against bytes per token
/usr/bin/python3 - "$RUN/metrics.jsonl" <<'PY' || fail "val_bpb is not val_loss over a plausible bytes per token"
import json, math, sys
r = [json.loads(l) for l in open(sys.argv[1]) if '"val_bpb"' in l][-1]
bytes_per_token = r["val_loss"] / math.log(2) / r["val_bpb"]
sys.exit(0 if 1.5 < bytes_per_token < 6 else 1)
PY

begin "samples change nothing in the training: the same curve without them"
curve "$RUN/metrics.jsonl" "$T/with"
expect_ok 2 -in "$DECK" -var run "$T/nosample" -var sample 0
curve "$T/nosample/metrics.jsonl" "$T/without"
check cmp -s "$T/with" "$T/without" || fail "the curve with samples differs from the one without"

begin "generate: text from the run's newest checkpoint, the same for the same seed"
expect_ok 1 generate -ckpt "$RUN" -prompt "The " -tokens 20 -seed 7 -temperature 0.8 -top_k 20
cp "$T/out" "$T/gen1"
check grep -q 'kv cache: .* bytes per token' "$T/err" || fail "generate does not report the cache"
check grep -q 'tokenizer: sentencepiece' "$T/err" || fail "generate does not use the checkpoint's tokenizer"
check grep -q '^The ' "$T/gen1" || fail "the text does not start with the prompt: $(cat "$T/gen1")"
expect_ok 1 generate -ckpt "$RUN/ckpt/step_00000004.h5" -prompt "The " -tokens 20 -seed 7 -temperature 0.8 -top_k 20
check cmp -s "$T/gen1" "$T/out" || fail "the same seed gave another text"
expect_ok 1 generate -ckpt "$RUN" -prompt "The " -tokens 20 -seed 8 -temperature 0.8 -top_k 20
refute cmp -s "$T/gen1" "$T/out" || fail "another seed gave the same text"

begin "export: the tokenizer goes with the model"
/usr/bin/python3 "$ROOT/tools/ckpt" export "$RUN/ckpt/step_00000004.h5" --format hf "$T/hf" >"$T/export.out" 2>&1
check [ $? -eq 0 ] || fail "export: $(cat "$T/export.out")"
check cmp -s "$T/hf/tokenizer.model" "$T/bpe/tokenizer.model" || fail "tokenizer.model is not the deck's"
check grep -q '"vocab_size": 512' "$T/hf/config.json" || fail "config.json vocab_size is not 512"
check grep -q '"tokenizer_class": "LlamaTokenizer"' "$T/hf/tokenizer_config.json" || fail "no tokenizer_config.json"

begin "bad: shards of another tokenizer (same vocab), named with both hashes"
rm -rf "$T/bad"
expect_bad 2 "$T/bpe/train_0000.bin: tokenizer hash 0x" "but $T/other/tokenizer.model hashes to 0x" \
  "(expected shards made with this tokenizer" -- -in "$DECK" -var run "$T/bad" -var tok "$T/other/tokenizer.model"
expect_absent "$T/bad" "bad data must not create the run directory"

begin "bad: a model vocab that is not the tokenizer's"
expect_bad 1 "$DECK:" "model vocab 600, but the tokenizer $T/bpe/tokenizer.model has vocab 512" \
  -- -in "$DECK" -var run "$T/bad" -var vocab 600

begin "bad: a tokenizer file that is not a SentencePiece model"
echo "not a model" >"$T/junk.model"
expect_bad 1 "$T/junk.model: not a SentencePiece model" -- -in "$DECK" -var run "$T/bad" -var tok "$T/junk.model"

begin "bad: a sample prompt longer than seq"
expect_bad 2 "$DECK:" "sample prompt" "encodes to" "below the model's seq 32" \
  -- -in "$DECK" -var run "$T/bad" -var prompt "$(head -c 400 "$T/a.txt" | tr -d "\n'\"")"

begin "bad: a generate prompt longer than seq; a tokenizer of another vocab"
expect_bad 1 "command line: -prompt encodes to" "(expected fewer than 32)" \
  -- generate -ckpt "$RUN" -prompt "$(head -c 400 "$T/a.txt")"
expect_bad 1 "$RUN/ckpt/step_00000004.h5: vocab 512, but the tokenizer $T/v600/tokenizer.model has vocab 600" \
  -- generate -ckpt "$RUN" -prompt "The " -tokenizer "$T/v600/tokenizer.model"
expect_bad 1 "command line: unknown option '-temprature'" "did you mean '-temperature'" \
  -- generate -ckpt "$RUN" -prompt "x" -temprature 1

finish
