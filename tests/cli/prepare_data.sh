#!/usr/bin/env bash
# tools/prepare-data --tokenizer bpe, checked by a reader of its own (struct
# and sentencepiece): the version-2 header of every shard, the tokenizer hash
# (FNV-1a 64 of tokenizer.model, computed here), the shards decode back to
# exactly the input bytes, text_bytes adds up, --shard-tokens splits, --model
# reuse gives the same shards. Bad input, each exit 2 with one line naming
# the file and nothing written: a missing, empty or binary file, a vocab too
# small for SentencePiece or too large for 2-byte tokens, a --model that is
# not one or disagrees with --vocab, a bad --valid, an existing directory.
# usage: prepare_data.sh XUANXUE [MPIEXEC]   (the binary is not used)
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PREP="$ROOT/tools/prepare-data"
F=/usr/share/games/fortunes
cat "$F/fortunes" "$F/literature" >"$T/a.txt"
cat "$F/riddles" >"$T/b.txt"

# reader OUT_DIR INPUT...: checks the directory against the inputs; prints the shard count
reader() {
  /usr/bin/python3 - "$@" <<'PY'
import glob, os, struct, sys
import sentencepiece as spm
out, inputs = sys.argv[1], sys.argv[2:]
model = os.path.join(out, "tokenizer.model")
h = 0xcbf29ce484222325
for b in open(model, "rb").read():
    h = ((h ^ b) * 0x100000001b3) % (1 << 64)
h = h or 1
sp = spm.SentencePieceProcessor(model_file=model)
shards = sorted(glob.glob(os.path.join(out, "train_*.bin"))) + [os.path.join(out, "val.bin")]
ids, text_bytes = [], 0
for path in shards:
    blob = open(path, "rb").read()
    magic, version, width, count, vocab, reserved, th, tb, rest = struct.unpack("<8sIIQIIQQ16s", blob[:64])
    assert (magic, version, width, reserved, rest) == (b"XXTOKENS", 2, 2, 0, bytes(16)), (path, magic, version)
    assert vocab == sp.get_piece_size(), (path, vocab)
    assert th == h, f"{path}: hash {th:#x}, tokenizer.model hashes to {h:#x}"
    assert len(blob) == 64 + 2 * count and count > 0, path
    t = list(struct.unpack(f"<{count}H", blob[64:]))
    assert max(t) < vocab
    assert tb == len(sp.decode(t).encode()), f"{path}: text_bytes {tb}"
    ids += t
    text_bytes += tb
want = b"".join(open(p, "rb").read() for p in inputs)
assert sp.decode(ids).encode() == want, "the shards do not decode to the input"
assert text_bytes == len(want), (text_bytes, len(want))
print(len(shards) - 1)
PY
}

begin "train a tokenizer, write shards; an independent reader agrees"
check "$PREP" --tokenizer bpe --vocab 400 --out "$T/o1" "$T/a.txt" "$T/b.txt" >"$T/out" 2>"$T/err" || fail "$(cat "$T/err")"
n=$(reader "$T/o1" "$T/a.txt" "$T/b.txt" 2>"$T/err")
check [ "$n" = 1 ] || fail "reader: $n $(cat "$T/err")"
check grep -q "vocab 400, hash 0x" "$T/out" || fail "summary: $(cat "$T/out")"

begin "--shard-tokens splits; --model reuse gives the same tokens"
check "$PREP" --tokenizer bpe --model "$T/o1/tokenizer.model" --shard-tokens 20000 --out "$T/o2" "$T/a.txt" "$T/b.txt" \
  >"$T/out" 2>"$T/err" || fail "$(cat "$T/err")"
n=$(reader "$T/o2" "$T/a.txt" "$T/b.txt" 2>"$T/err")
check [ "${n:-0}" -gt 1 ] || fail "expected several shards, reader says: $n $(cat "$T/err")"
check cmp -s "$T/o1/val.bin" "$T/o2/val.bin" || fail "val.bin differs with the reused model"
check cmp -s <(cat "$T/o1"/train_*.bin | wc -c) <(echo $(( $(cat "$T/o2"/train_*.bin | wc -c) - 64 * (n - 1) ))) ||
  fail "the split shards do not hold the same tokens"

# bad NAME PREFIX ARGS...: exit 2, one stderr line starting with PREFIX, no output directory
bad() {
  local name=$1 prefix=$2
  shift 2
  begin "bad: $name"
  rm -rf "$T/bad"
  "$PREP" "$@" >"$T/out" 2>"$T/err"
  local rc=$?
  check [ $rc -eq 2 ] || fail "exit code $rc (expected 2): $(cat "$T/err")"
  check [ "$(wc -l <"$T/err")" -eq 1 ] || fail "expected one line on stderr: $(cat "$T/err")"
  check grep -q -F -- "prepare-data: $prefix" "$T/err" || fail "stderr: $(cat "$T/err") (expected 'prepare-data: $prefix')"
  check [ ! -e "$T/bad" ] || fail "$T/bad was written"
  check [ -z "$(ls -d "$T"/bad.tmp.* 2>/dev/null)" ] || fail "a temp directory was left behind"
}
: >"$T/empty.txt"
head -c 3000 /bin/ls >"$T/binary.txt"
printf 'good text\nthen \xff\xfe bad\n' >"$T/latin.txt"
bad "a missing file" "$T/none.txt: no such file" --tokenizer bpe --vocab 400 --out "$T/bad" "$T/none.txt"
bad "an empty file" "$T/empty.txt: offset 0: empty file" --tokenizer bpe --vocab 400 --out "$T/bad" "$T/a.txt" "$T/empty.txt"
bad "binary garbage" "$T/binary.txt: offset " --tokenizer bpe --vocab 400 --out "$T/bad" "$T/binary.txt"
bad "bytes that are not UTF-8" "$T/latin.txt: offset 15: byte 0xff is not UTF-8" --tokenizer bpe --vocab 400 --out "$T/bad" "$T/latin.txt"
bad "a vocab too small for SentencePiece" "$T/a.txt: SentencePiece cannot train a vocab of 100" \
  --tokenizer bpe --vocab 100 --out "$T/bad" "$T/a.txt"
bad "a vocab larger than 2-byte tokens hold" "command line: --vocab 70000 (expected 1 to 65536" \
  --tokenizer bpe --vocab 70000 --out "$T/bad" "$T/a.txt"
bad "a --model that is not one" "$T/a.txt: not a SentencePiece model" --tokenizer bpe --model "$T/a.txt" --out "$T/bad" "$T/a.txt"
bad "--vocab against --model's" "$T/o1/tokenizer.model: vocab 400, but --vocab 512" \
  --tokenizer bpe --model "$T/o1/tokenizer.model" --vocab 512 --out "$T/bad" "$T/a.txt"
bad "--valid out of range" "command line: --valid 1.5" --tokenizer bpe --vocab 400 --valid 1.5 --out "$T/bad" "$T/a.txt"
bad "text files without --tokenizer" "command line: text files, --vocab and --model need --tokenizer bpe" "$T/a.txt"

begin "bad: an existing directory is kept as it was (exit 2), and replaced with --force"
before=$(snapshot "$T/o1")
"$PREP" --tokenizer bpe --vocab 450 --out "$T/o1" "$T/b.txt" >"$T/out" 2>"$T/err"
check [ $? -eq 2 ] || fail "exit code (expected 2)"
check grep -q "prepare-data: $T/o1: exists (expected a new directory, or --force" "$T/err" || fail "$(cat "$T/err")"
check [ "$(snapshot "$T/o1")" = "$before" ] || fail "$T/o1 changed"
check "$PREP" --tokenizer bpe --vocab 450 --force --out "$T/o1" "$T/b.txt" >"$T/out" 2>"$T/err" || fail "$(cat "$T/err")"
n=$(reader "$T/o1" "$T/b.txt" 2>"$T/err")
check [ "$n" = 1 ] || fail "after --force: $n $(cat "$T/err")"

finish
