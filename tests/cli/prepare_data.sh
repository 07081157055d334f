#!/usr/bin/env bash
# tools/prepare-data --tokenizer bpe: a SentencePiece BPE model trained on a
# few hundred KB of Debian's fortunes, its version-2 shards read back by an
# independent reader (struct, our own FNV-1a and byte-level decoder, and
# sentencepiece's decode), --shard-tokens, --model reuse, a rerun into an
# existing directory, and bad input: exit code 2, one line naming the file and
# what was expected, nothing written.
# Shard v2 header (docs/DATA.md), 64 bytes, little-endian:
#   0 magic "XXTOKENS" | 8 version u32 = 2 | 12 token bytes u32 | 16 count u64 |
#   24 vocab u32 | 28 reserved u32 | 32 tokenizer hash u64 (FNV-1a 64 of
#   tokenizer.model) | 40 text bytes u64 | 48 16 reserved bytes | 64 tokens
# usage: prepare_data.sh XUANXUE [MPIEXEC] (the binary is not used)
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PD=$root/tools/prepare-data
PY=/usr/bin/python3
FORTUNES=/usr/share/games/fortunes
VOCAB=512
SHARD=60000  # tokens: the ~430 KB below make ~250k tokens, so 4 or 5 shards

# run_pd ARGS...: runs tools/prepare-data; sets RC, stdout in $T/out, stderr in $T/err.
run_pd() {
  LAST_CMD="$PD $*"
  timeout "$RUN_TIMEOUT" "$PD" "$@" >"$T/out" 2>"$T/err"
  RC=$?
}

# The input: three fortune files, and one of our own with what a tokenizer
# can get wrong: multi-byte characters (rare, so byte pieces), tabs, CRLF,
# leading and repeated spaces, empty lines, control bytes, no final newline.
IN=$T/in
mkdir -p "$IN"
for f in computers science linux; do
  cp "$FORTUNES/$f" "$IN/$f" || { echo "FAIL: $FORTUNES/$f missing (install the fortunes package)" >&2; exit 1; }
done
printf '  two leading spaces\n\ttab\tand  double  spaces \r\n\n\n' >"$IN/tricky"
printf 'caf\xc3\xa9 na\xc3\xafve \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e \xf0\x9f\x98\x80 \xce\xbb\xce\xb1\n' >>"$IN/tricky"
printf 'bell \x07 escape \x1b del \x7f\n   \n trailing line without newline ' >>"$IN/tricky"
FILES=("$IN/computers" "$IN/science" "$IN/tricky" "$IN/linux")
cat "${FILES[@]}" >"$T/all.txt"

# verify_shards DIR VOCAB SHARD_TOKENS INPUT VALID: the independent reader;
# prints its problems and fails when there is one.
verify_shards() {
  "$PY" - "$@" <<'PY'
import os, re, struct, sys
import sentencepiece as spm

out, want_vocab, shard_tokens = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
text_path, valid = sys.argv[4], float(sys.argv[5])
problems = []
def bad(msg): problems.append(msg)

def fnv(data):
    h = 0xcbf29ce484222325
    for b in data:
        h ^= b
        h = (h * 0x100000001b3) % (1 << 64)
    return h

model = open(os.path.join(out, "tokenizer.model"), "rb").read()
want_hash = fnv(model) or 1
sp = spm.SentencePieceProcessor(model_file=os.path.join(out, "tokenizer.model"))
vocab = sp.vocab_size()

names = sorted(os.listdir(out))
train = [n for n in names if re.fullmatch(r"train_\d{4}\.bin", n)]
if train != ["train_%04d.bin" % i for i in range(len(train))]: bad("train shards not numbered 0..: %s" % train)
if set(names) != set(train) | {"tokenizer.model", "val.bin"}: bad("unexpected files: %s" % names)

def piece_bytes(i):  # our own byte-level decoding of one id
    p = sp.id_to_piece(i)
    m = re.fullmatch(r"<0x([0-9A-F]{2})>", p)
    if m: return bytes([int(m.group(1), 16)])
    if sp.is_control(i): return b""
    return p.replace("\u2581", " ").encode("utf-8")
table = [piece_bytes(i) for i in range(vocab)]

stream, counts = [], []
for name in train + ["val.bin"]:
    data = open(os.path.join(out, name), "rb").read()
    magic, version, width, count, v, res, h, text_bytes, res16 = struct.unpack_from("<8sIIQIIQQ16s", data)
    where = "%s:" % name
    if magic != b"XXTOKENS": bad("%s magic %r" % (where, magic))
    if version != 2: bad("%s version %d" % (where, version))
    if width != 2: bad("%s token bytes %d (expected 2 for vocab %d)" % (where, width, vocab))
    if v != vocab or v != want_vocab: bad("%s vocab %d (model %d)" % (where, v, vocab))
    if res != 0 or res16 != bytes(16): bad("%s reserved fields not zero" % where)
    if h != want_hash: bad("%s hash %016x, FNV-1a of tokenizer.model is %016x" % (where, h, want_hash))
    if count < 1 or len(data) != 64 + 2 * count: bad("%s count %d, file %d bytes" % (where, count, len(data)))
    tokens = list(struct.unpack_from("<%dH" % count, data, 64))
    if max(tokens) >= vocab: bad("%s token %d >= vocab" % (where, max(tokens)))
    if name.startswith("train") and count > shard_tokens: bad("%s %d tokens > %d" % (where, count, shard_tokens))
    if name.startswith("train") and name != train[-1] and count != shard_tokens:
        bad("%s %d tokens, a shard before the last holds %d" % (where, count, shard_tokens))
    got = len(b"".join(table[t] for t in tokens))
    if text_bytes != got: bad("%s text_bytes %d, its tokens decode to %d bytes" % (where, text_bytes, got))
    stream += tokens
    counts.append((count, text_bytes))

text = open(text_path, "rb").read()
total = len(stream)
want_val = max(1, int(total * valid + 0.5))
if counts[-1][0] != want_val: bad("val.bin holds %d tokens, expected %d of %d" % (counts[-1][0], want_val, total))
if sum(b for _, b in counts) != len(text): bad("text_bytes sum to %d, the input has %d" % (sum(b for _, b in counts), len(text)))
if b"".join(table[t] for t in stream) != text: bad("the byte-level decode of train + val differs from the input")
if sp.decode(stream).encode("utf-8") != text: bad("sentencepiece's decode of train + val differs from the input")
if sp.unk_id() in stream: bad("<unk> in the stream")
for p in problems: print("  " + p, file=sys.stderr)
print("%d shards + val, %d tokens, %d bytes" % (len(train), total, len(text)))
sys.exit(1 if problems else 0)
PY
}

no_output() {  # no_output DIR WHY: neither DIR nor a DIR.tmp.* next to it
  expect_absent "$1" "$2"
  local left
  left=$(find "$(dirname "$1")" -maxdepth 1 -name "$(basename "$1").tmp.*" | wc -l)
  check [ "$left" -eq 0 ] || fail "$left temp directories $1.tmp.* left behind ($2)"
}

# expect_bad_pd PREFIX [HINT...] -- ARGS...: tools/prepare-data ARGS (with
# --out $BAD) is refused as bad input: exit code 2, stderr one line that
# starts with PREFIX and holds every HINT, no traceback, nothing written.
BAD=$T/bad
expect_bad_pd() {
  local prefix=$1 h
  shift
  split_hints "$@"
  local hints=("${HINTS[@]}")
  run_pd --tokenizer bpe --out "$BAD" "${ARGS[@]}"
  local before=$FAILS
  check [ "$RC" -eq 2 ] || fail "exit code $RC (expected 2)"
  check [ "$(wc -l <"$T/err")" -eq 1 ] || fail "stderr has $(wc -l <"$T/err") lines (expected one)"
  check [ "$(lines_starting_with "$prefix" "$T/err")" -eq 1 ] || fail "stderr does not start with '$prefix'"
  for h in "${hints[@]}"; do
    check grep -q -F -- "$h" "$T/err" || fail "stderr lacks '$h'"
  done
  refute grep -q -E 'Traceback|Error:|Internal:' "$T/err" || fail "a traceback or SentencePiece's raw error"
  no_output "$BAD" "bad input must write nothing"
  [ "$FAILS" -eq "$before" ] || show_run
}

expect_usage() {  # expect_usage HINT ARGS...: an argparse usage error, exit 2
  local hint=$1
  shift
  run_pd "$@" --out "$BAD"
  local before=$FAILS
  check [ "$RC" -eq 2 ] || fail "exit code $RC (expected 2)"
  check grep -q -F -- "prepare-data: error: $hint" "$T/err" || fail "stderr lacks 'prepare-data: error: $hint'"
  no_output "$BAD" "a usage error must write nothing"
  [ "$FAILS" -eq "$before" ] || show_run
}

# ----------------------------------------------------------------------------
# training and the shards

begin "train vocab $VOCAB, shards of $SHARD tokens"
OUT=$T/bpe
run_pd --tokenizer bpe --vocab "$VOCAB" --out "$OUT" --shard-tokens "$SHARD" "${FILES[@]}"
check [ "$RC" -eq 0 ] || { fail "exit code $RC (expected 0)"; show_run; }
check verify_shards "$OUT" "$VOCAB" "$SHARD" "$T/all.txt" 0.05 || fail "the shards do not read back"
n=$(find "$OUT" -name 'train_*.bin' | wc -l)
check [ "$n" -ge 3 ] || fail "$n training shards (expected --shard-tokens $SHARD to make at least 3)"
no_output "$T/nothing" "(control)"
check [ "$(find "$T" -maxdepth 1 -name 'bpe.tmp.*' | wc -l)" -eq 0 ] || fail "bpe.tmp.* left behind"
hash=$("$PY" -c '
import sys
h = 0xcbf29ce484222325
for b in open(sys.argv[1], "rb").read(): h = ((h ^ b) * 0x100000001b3) & (2**64 - 1)
print("0x%016x" % (h or 1))' "$OUT/tokenizer.model")
check grep -q -F "tokenizer hash $hash" "$T/out" || { fail "the summary lacks 'tokenizer hash $hash'"; show_run; }
check grep -q -F "vocab $VOCAB, 2-byte tokens" "$T/out" || { fail "the summary lacks the vocab"; show_run; }
check grep -q -F "$(stat -c %s "$T/all.txt") text bytes" "$T/out" || { fail "the summary lacks the text bytes"; show_run; }
check grep -q -E "[0-9.]+ bytes per token" "$T/out" || { fail "the summary lacks bytes per token"; show_run; }

begin "one shard by default, another --valid, the same model"
run_pd --tokenizer bpe --vocab "$VOCAB" --out "$T/one" --valid 0.2 "${FILES[@]}"
check [ "$RC" -eq 0 ] || { fail "exit code $RC (expected 0)"; show_run; }
check verify_shards "$T/one" "$VOCAB" 100000000 "$T/all.txt" 0.2 || fail "the shards do not read back"
check [ -f "$T/one/train_0000.bin" ] || fail "no train_0000.bin"
check [ ! -e "$T/one/train_0001.bin" ] || fail "a train_0001.bin (expected one training shard)"
check cmp -s "$OUT/tokenizer.model" "$T/one/tokenizer.model" || fail "training twice gave different models"

begin "--model reuse gives the same files"
run_pd --tokenizer bpe --model "$OUT/tokenizer.model" --out "$T/again" --shard-tokens "$SHARD" "${FILES[@]}"
check [ "$RC" -eq 0 ] || { fail "exit code $RC (expected 0)"; show_run; }
check diff -r "$OUT" "$T/again" >/dev/null || fail "the shards differ from the first run's"
run_pd --tokenizer bpe --model "$OUT/tokenizer.model" --vocab "$VOCAB" --out "$T/again2" --shard-tokens "$SHARD" "${FILES[@]}"
check [ "$RC" -eq 0 ] || { fail "--vocab equal to the model's: exit code $RC (expected 0)"; show_run; }
check diff -r "$OUT" "$T/again2" >/dev/null || fail "with --vocab $VOCAB: the shards differ from the first run's"

begin "a rerun into an existing directory replaces its shards"
echo "mine" >"$T/again/notes.txt"
run_pd --tokenizer bpe --model "$OUT/tokenizer.model" --out "$T/again" "${FILES[@]}"
check [ "$RC" -eq 0 ] || { fail "exit code $RC (expected 0)"; show_run; }
check [ ! -e "$T/again/train_0001.bin" ] || fail "the stale train_0001.bin of the earlier run is still there"
check [ "$(cat "$T/again/notes.txt")" = mine ] || fail "a file of the user's was touched"
rm "$T/again/notes.txt"
check verify_shards "$T/again" "$VOCAB" 100000000 "$T/all.txt" 0.05 || fail "the shards do not read back"
no_output "$T/nothing" "(control)"
check [ "$(find "$T" -maxdepth 1 -name 'again.tmp.*' | wc -l)" -eq 0 ] || fail "again.tmp.* left behind"

# ----------------------------------------------------------------------------
# bad input

begin "missing file"
expect_bad_pd "prepare-data: $T/nope.txt: no such file" "(expected a UTF-8 text file)" -- \
  --vocab "$VOCAB" "$IN/science" "$T/nope.txt"

begin "empty file"
: >"$T/empty.txt"
expect_bad_pd "prepare-data: $T/empty.txt: empty file" "(expected UTF-8 text)" -- \
  --vocab "$VOCAB" "$IN/science" "$T/empty.txt"
expect_bad_pd "prepare-data: $T/empty.txt: empty file" -- --vocab "$VOCAB" "$T/empty.txt" "$T/empty.txt"

begin "a directory"
expect_bad_pd "prepare-data: $IN: is a directory" -- --vocab "$VOCAB" "$IN"

begin "not UTF-8"
printf 'hello\nw\xc3\xb6rld\n\xff\xfe binary\n' >"$T/latin.bin"
expect_bad_pd "prepare-data: $T/latin.bin: byte offset 13: byte 0xff is not UTF-8" "(expected UTF-8 text" -- \
  --vocab "$VOCAB" "$IN/science" "$T/latin.bin"
printf 'cut \xe6\x97' >"$T/cut.txt"
expect_bad_pd "prepare-data: $T/cut.txt: byte offset 4: byte 0xe6 is not UTF-8" -- --vocab "$VOCAB" "$T/cut.txt"
head -c 3000 /bin/sh >"$T/elf.bin"
expect_bad_pd "prepare-data: $T/elf.bin: byte offset " "is this a binary file?" -- --vocab "$VOCAB" "$T/elf.bin"

begin "NUL bytes"
printf 'text\nab\0cd\n' >"$T/nul.txt"
expect_bad_pd "prepare-data: $T/nul.txt: byte offset 7: NUL byte" "(expected UTF-8 text without NUL bytes" -- \
  --vocab "$VOCAB" "$T/nul.txt"

begin "vocab too small for the text"
expect_bad_pd "prepare-data: $IN/computers, $IN/science, $IN/tricky and 1 more file: --vocab 300 is too small" \
  "SentencePiece needs at least " "expected --vocab >= " -- --vocab 300 "${FILES[@]}"
need=$(sed -n 's/.*needs at least \([0-9]*\) .*/\1/p' "$T/err")
check [ "${need:-0}" -gt 300 ] || fail "the minimum named, '$need', is not above 300"
# The minimum it names is enough.
run_pd --tokenizer bpe --vocab "$need" --out "$T/min" "${FILES[@]}"
check [ "$RC" -eq 0 ] || { fail "--vocab $need (the minimum named): exit code $RC"; show_run; }
expect_bad_pd "prepare-data: $IN/science: --vocab 1 is too small" "expected --vocab >= 260" -- --vocab 1 "$IN/science"

begin "vocab too large for the text"
head -c 2000 "$IN/science" >"$T/little.txt"
expect_bad_pd "prepare-data: $T/little.txt: --vocab 5000 is too large for this text" "(expected --vocab <= " -- \
  --vocab 5000 "$T/little.txt"

begin "vocab out of range"
expect_bad_pd "prepare-data: --vocab 65537: out of range" "(expected 1 <= V <= 65536" -- --vocab 65537 "$IN/science"
expect_bad_pd "prepare-data: --vocab 0: out of range" -- --vocab 0 "$IN/science"
expect_bad_pd "prepare-data: --vocab -5: out of range" -- --vocab -5 "$IN/science"

begin "--model that is not a model"
expect_bad_pd "prepare-data: $IN/science: not a SentencePiece model" "(expected a .model file" -- \
  --model "$IN/science" "$IN/science"
expect_bad_pd "prepare-data: $T/empty.txt: not a SentencePiece model" -- --model "$T/empty.txt" "$IN/science"
expect_bad_pd "prepare-data: $T/no.model: No such file or directory" -- --model "$T/no.model" "$IN/science"

begin "--vocab disagrees with --model"
expect_bad_pd "prepare-data: $OUT/tokenizer.model: the model's vocab is $VOCAB, --vocab says 1000" \
  "(expected the same, or no --vocab)" -- --model "$OUT/tokenizer.model" --vocab 1000 "$IN/science"

begin "--valid out of range"
for v in 0 1 -0.1 1.5; do
  expect_bad_pd "prepare-data: --valid $v: out of range" "(expected 0 < F < 1" -- \
    --vocab "$VOCAB" --valid "$v" "$IN/science"
done
expect_bad_pd "prepare-data: --shard-tokens 0: out of range" -- --vocab "$VOCAB" --shard-tokens 0 "$IN/science"

begin "too little text"
printf 'x' >"$T/x.txt"
expect_bad_pd "prepare-data: $T/x.txt: 1 token of text, too few" "(expected at least 2" -- \
  --model "$OUT/tokenizer.model" "$T/x.txt"

begin "text the tokenizer cannot give back"
# U+2581 is SentencePiece's space symbol: it decodes to a space.
printf 'fine\nab\xe2\x96\x81cd\n' >"$T/meta.txt"
expect_bad_pd "prepare-data: $T/meta.txt: byte offset 7: the tokenizer does not give back the text" "U+2581" -- \
  --model "$OUT/tokenizer.model" "$T/meta.txt"

begin "usage errors"
expect_usage "--tokenizer bpe needs --vocab V" --tokenizer bpe "$IN/science"
expect_usage "--tokenizer bpe needs at least one text FILE" --tokenizer bpe --vocab "$VOCAB"
expect_usage "FILEs and options need --tokenizer bpe" --vocab "$VOCAB" "$IN/science"
expect_usage "--tokenizer wordpiece: expected bpe or a Hugging Face tokenizer.json" --tokenizer wordpiece --vocab "$VOCAB" "$IN/science"
expect_usage "argument --vocab: invalid int value" --tokenizer bpe --vocab lots "$IN/science"

begin "a failure leaves an existing directory as it was"
before=$(snapshot "$OUT")
for args in "--vocab 300" "--vocab $VOCAB --valid 2" "--model $IN/science"; do
  # shellcheck disable=SC2086  # $args is split on purpose
  run_pd --tokenizer bpe $args --out "$OUT" "${FILES[@]}"
  check [ "$RC" -eq 2 ] || { fail "$args: exit code $RC (expected 2)"; show_run; }
  check [ "$(snapshot "$OUT")" = "$before" ] || fail "$args: $OUT changed"
  check [ "$(find "$T" -maxdepth 1 -name 'bpe.tmp.*' | wc -l)" -eq 0 ] || fail "$args: bpe.tmp.* left behind"
done
run_pd --tokenizer bpe --vocab "$VOCAB" --out "$OUT" "${FILES[@]}" "$T/nul.txt"
check [ "$RC" -eq 2 ] || { fail "a NUL file after good ones: exit code $RC (expected 2)"; show_run; }
check [ "$(snapshot "$OUT")" = "$before" ] || fail "a NUL file after good ones: $OUT changed"

finish
