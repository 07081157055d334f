#!/usr/bin/env bash
# Bad data files: exit code 2, one message naming the file and, for a shard,
# the byte offset, with what was expected; no run directory is created.
# Shard layout (docs/DATA.md), version 1: 32-byte header, little-endian
#   0 magic "XXTOKENS" | 8 version u32 | 12 token bytes u32 | 16 count u64 |
#   24 vocab u32 | 28 reserved u32 | 32 tokens
# (version 2 adds 32 bytes: tokenizer hash u64, text bytes u64, 16 reserved).
# usage: bad_data.sh XUANXUE [MPIEXEC]
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CORPUS=$T/corpus.txt
RUN=$T/run
GOOD=$T/good.deck
D=$T/deck.deck
make_corpus "$CORPUS"
make_deck "$GOOD" "$CORPUS" "$RUN"

le() {  # le VALUE BYTES: VALUE as BYTES little-endian bytes
  local i h
  for ((i = 0; i < $2; ++i)); do
    printf -v h '%02x' $((($1 >> (8 * i)) & 255))
    printf "\\x$h"
  done
}

# shard_header MAGIC VERSION WIDTH COUNT VOCAB RESERVED
shard_header() {
  printf '%s' "$1"
  le "$2" 4
  le "$3" 4
  le "$4" 8
  le "$5" 4
  le "$6" 4
}

tokens() {  # tokens WIDTH T...: 2- or 4-byte tokens
  local w=$1 t
  shift
  for t in "$@"; do le "$t" "$w"; done
}

# A good shard: 400 tokens of width 2, vocab 256.
GOOD_TOKENS=()
for ((i = 0; i < 400; ++i)); do GOOD_TOKENS+=($(((i * 7 + i / 13) % 256))); done
{ shard_header XXTOKENS 1 2 400 256 0; tokens 2 "${GOOD_TOKENS[@]}"; } >"$T/good.bin"

# bad_data NAME FORMAT FILE NPS PREFIX [HINT...]: the good deck reading FILE
# as FORMAT fails as bad input at each of NPS ranks; no run directory.
bad_data() {
  local name=$1 format=$2 file=$3 nps=$4
  shift 4
  begin "$name"
  sed -e "s#^data bytes [^ ]*#data $format $file#" "$GOOD" >"$D"
  local np
  for np in $nps; do
    rm -rf "$RUN"
    expect_bad "$np" "$@" -- -in "$D"
    expect_absent "$RUN" "np $np: bad data must not create the run directory"
  done
}

# Positive control: the shard writer above is right, so each failure below
# is the damage's.
begin "good shard trains (control)"
sed -e "s#^data bytes [^ ]*#data shard $T/good.bin#" "$GOOD" >"$D"
expect_ok 1 -in "$D"
check [ -s "$RUN/metrics.jsonl" ] || fail "no metrics.jsonl after a good run"
rm -rf "$RUN"

printf 'ABCDEFGH' >"$T/magic.bin"
head -c 2000 "$CORPUS" >>"$T/magic.bin"
bad_data "shard with a bad magic" shard "$T/magic.bin" "1 2" \
  "$T/magic.bin: offset 0: bad magic 'ABCDEFGH'" "(expected 'XXTOKENS'"

# A text file given as a shard is the common slip.
bad_data "text file given as a shard" shard "$CORPUS" "1" \
  "$CORPUS: offset 0: bad magic 'Line 1: '" "(expected 'XXTOKENS'"

{ shard_header XXTOKENS 3 2 4 256 0; tokens 2 1 2 3 4; } >"$T/version.bin"
bad_data "shard version" shard "$T/version.bin" "1" \
  "$T/version.bin: offset 8: shard version 3" "(expected 1 or 2)"

{ shard_header XXTOKENS 1 3 4 256 0; tokens 2 1 2 3 4 5 6; } >"$T/width.bin"
bad_data "shard token width" shard "$T/width.bin" "1" \
  "$T/width.bin: offset 12: token width 3 bytes" "(expected 2 or 4)"

head -c 20 "$T/good.bin" >"$T/header.bin"
bad_data "shard cut inside its header" shard "$T/header.bin" "1 2" \
  "$T/header.bin: offset 20: file ends after 20 bytes" "(expected a 32-byte shard header)"

head -c 500 "$T/good.bin" >"$T/cut.bin"
bad_data "shard cut inside its tokens" shard "$T/cut.bin" "1" \
  "$T/cut.bin: offset 500: file holds 234 tokens, header says 400"

# Many shards: a glob that matches nothing, and one cut shard among good ones.
bad_data "shard glob that matches nothing" shard "'$T/none_*.bin'" "1 2" \
  "$D:7: the shard pattern '$T/none_*.bin' matches no file" "(expected shards"
mkdir -p "$T/many"
for s in 0 1 2; do cp "$T/good.bin" "$T/many/train_000$s.bin"; done
begin "many shards train (control)"
sed -e "s#^data bytes [^ ]*#data shard '$T/many/train_*.bin'#" "$GOOD" >"$D"
expect_ok 2 -in "$D"
check grep -q "data: 3 file(s), 1200 tokens" "$T/out" || fail "the three shards are not one corpus of 1200 tokens"
rm -rf "$RUN"
head -c 300 "$T/good.bin" >"$T/many/train_0001.bin"
bad_data "one truncated shard among many" shard "'$T/many/train_*.bin'" "1 2" \
  "$T/many/train_0001.bin: offset 300: file holds 134 tokens, header says 400" "(a truncated shard?)"

{ shard_header XXTOKENS 1 2 4 256 0; tokens 2 1 2 3 4 5; } >"$T/trailing.bin"
bad_data "shard with trailing bytes" shard "$T/trailing.bin" "1" \
  "$T/trailing.bin: offset 40: 2 bytes after the 4 tokens the header announces" "(expected end of file)"

{ shard_header XXTOKENS 1 2 4 10 0; tokens 2 1 2 20 3; } >"$T/token.bin"
bad_data "shard token outside its vocab" shard "$T/token.bin" "1 2" \
  "$T/token.bin: offset 36: token 20 is outside the vocab of 10"

{ shard_header XXTOKENS 1 2 400 1000 0; tokens 2 "${GOOD_TOKENS[@]}"; } >"$T/vocab.bin"
bad_data "shard vocab larger than the model's" shard "$T/vocab.bin" "1" \
  "$T/vocab.bin: corpus vocabulary 1000 exceeds the model's vocab 256" "(expected model vocab >= 1000)"

head -c 20 "$CORPUS" >"$T/small.txt"
bad_data "corpus too small for one window" bytes "$T/small.txt" "1 2" \
  "$T/small.txt: corpus has 20 tokens, too few for seq 16" "need at least 33 tokens"

: >"$T/empty.txt"
bad_data "empty corpus" bytes "$T/empty.txt" "1" \
  "$T/empty.txt: offset 0: empty file" "(expected at least one byte of text)"

# partition contiguous: each rank its own slice; a resume at another world
# size would hand every rank other data, so it is refused.
begin "partition contiguous trains on 2 ranks; resumed on 1 it is refused (setup and case)"
make_deck "$T/part.deck" "$CORPUS" "$T/part" 3
sed -i 's#^data bytes \([^ ]*\)#data bytes \1 partition contiguous#' "$T/part.deck"
expect_ok 2 -in "$T/part.deck"
check grep -q "partition contiguous: each rank reads its own slice" "$T/out" || fail "start-up does not say partition contiguous"
expect_bad 1 "$T/part/ckpt/step_00000003.h5: written by 2 ranks, resumed on 1 (partition contiguous" \
  "expected 2 ranks)" -- -in "$T/part.deck" -var steps 4 -resume auto
rm -rf "$T/part"

finish
