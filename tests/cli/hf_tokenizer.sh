#!/usr/bin/env bash
# A released model's tokenizer (a Hugging Face tokenizer.json, byte-level BPE)
# end to end: tools/prepare-data --tokenizer FILE.json writes shards (4-byte
# tokens above 65536 ids); xuanxue trains on them at 2 ranks with bits per
# byte and samples; `xuanxue generate` decodes through it. Bad input, each
# exit 2 with one message naming the file: a tokenizer.json that is not JSON
# (its byte), one whose merges name a missing token (its JSON path), a model
# vocab that is not the tokenizer's, shards of another tokenizer.
# usage: hf_tokenizer.sh XUANXUE [MPIEXEC]
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PREP="$ROOT/tools/prepare-data"
FIX="$ROOT/tests/data/hf_tokenizer"

begin "prepare: shards through the tokenizer.json fixture (setup)"
check "$PREP" --tokenizer "$FIX/tokenizer.json" --out "$T/hf" --valid 0.1 "$FIX/train.txt" "$FIX/multilingual.txt" \
  >"$T/prep.out" 2>&1 || fail "prepare-data: $(cat "$T/prep.out")"
check cmp -s "$T/hf/tokenizer.json" "$FIX/tokenizer.json" || fail "tokenizer.json is not a copy of the fixture"
check grep -q "vocab 1059, 2-byte tokens" "$T/prep.out" || fail "prepare-data: $(tail -1 "$T/prep.out")"
# The shards hold the reference's ids of the texts (tests/hf_tokenizer/reference.py), in order.
/usr/bin/python3 - "$ROOT" "$T/hf" <<'PY' || fail "the shards' ids are not the reference's"
import glob, json, os, struct, sys
sys.path.insert(0, os.path.join(sys.argv[1], "tests", "hf_tokenizer"))
import reference
fix = os.path.join(sys.argv[1], "tests", "data", "hf_tokenizer")
tok = reference.load(os.path.join(fix, "tokenizer.json"))
want = []
for name in ("train.txt", "multilingual.txt"):
    want += tok.encode(open(os.path.join(fix, name), encoding="utf-8", newline="").read())
got = []
for path in sorted(glob.glob(os.path.join(sys.argv[2], "train_*.bin"))) + [os.path.join(sys.argv[2], "val.bin")]:
    data = open(path, "rb").read()
    magic, version, token_bytes, count = struct.unpack_from("<8sIIQ", data)
    fmt = "<%d%s" % (count, "H" if token_bytes == 2 else "I")
    got += list(struct.unpack_from(fmt, data, 64))
sys.exit(0 if got == want else 1)
PY
[ "$FAILS" -eq 0 ] || finish

RUN=$T/run
DECK=$T/hf.deck
cat >"$DECK" <<EOT
variable vocab 1059
variable tok $T/hf/tokenizer.json
seed 1
model dense vocab \${vocab} dim 32 layers 1 heads 2 ffn 64 seq 32
data shard '$T/hf/train_*.bin' valid $T/hf/val.bin tokenizer \${tok} batch 2 workers 1
output dir \${run} log_every 1
eval every 2 batches 2
sample every 2 prompt '玄学 is ' tokens 8
checkpoint every 4
run 4
EOT

begin "train 4 steps on 2 ranks: the tokenizer named, bits per byte, samples"
expect_ok 2 -in "$DECK" -var run "$RUN"
check grep -q "tokenizer.json: $T/hf/tokenizer.json, byte-level BPE, vocab 1059" "$T/out" ||
  fail "start-up does not name the tokenizer: $(grep -i tokeni "$T/out" | head -3)"
check grep -q '"val_bpb"' "$RUN/metrics.jsonl" || fail "no val_bpb in metrics.jsonl"
check [ "$(grep -c -E '^step +[24] \| sample \(8 tokens' "$T/out")" -eq 2 ] || fail "expected samples at steps 2 and 4"

begin "generate: decodes through the tokenizer.json, the prompt first"
expect_ok 1 generate -ckpt "$RUN" -prompt "玄学 is " -tokens 12 -seed 7
check grep -q '^玄学 is ' "$T/out" || fail "the text does not start with the prompt: $(cat "$T/out")"

begin "bad: a tokenizer.json that is not JSON, named with its byte"
printf '{"model": {"vocab": [1, 2' >"$T/cut.json"
expect_bad 1 "$T/cut.json: byte" "not JSON" -- -in "$DECK" -var run "$T/bad" -var tok "$T/cut.json"
expect_absent "$T/bad" "a bad tokenizer must not create the run directory"

begin "bad: merges naming a token the vocab lacks, named with the JSON path"
/usr/bin/python3 - "$FIX/tokenizer.json" "$T/merge.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1], encoding="utf-8"))
m = j["model"]["merges"]
m[5] = "\u0100\u0101\u0102 x" if isinstance(m[5], str) else ["\u0100\u0101\u0102", "x"]
json.dump(j, open(sys.argv[2], "w", encoding="utf-8"), ensure_ascii=False)
PY
expect_bad 1 "$T/merge.json: /model/merges/5" "is not in the vocab" -- -in "$DECK" -var run "$T/bad" -var tok "$T/merge.json"

begin "bad: a model vocab that is not the tokenizer's; prepare-data refuses a broken tokenizer.json"
expect_bad 1 "$DECK:" "model vocab 1100, but the tokenizer $T/hf/tokenizer.json has vocab 1059" \
  -- -in "$DECK" -var run "$T/bad" -var vocab 1100
"$PREP" --tokenizer "$T/merge.json" --out "$T/never" "$FIX/train.txt" >"$T/prep.out" 2>&1
check [ $? -eq 2 ] || fail "prepare-data on a broken tokenizer.json: exit $?, expected 2"
check grep -q "$T/merge.json: /model/merges/5" "$T/prep.out" || fail "prepare-data: $(cat "$T/prep.out")"
expect_absent "$T/never" "prepare-data must write nothing for a broken tokenizer"

finish
