#!/usr/bin/env bash
# Bad decks: each gets exit code 2 and one message "FILE:LINE: what (expected
# ...)" with the right line, at 1 and 2 ranks, and no run directory is created.
# usage: bad_deck.sh XUANXUE [MPIEXEC]
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CORPUS=$T/corpus.txt
RUN=$T/run
GOOD=$T/good.deck
D=$T/deck.deck  # every bad deck is written here, so messages name this file
make_corpus "$CORPUS"
make_deck "$GOOD" "$CORPUS" "$RUN"

# bad_deck NAME SED-SCRIPT PREFIX [HINT...] [-- EXTRA-ARGS...]
# Writes $D = the good deck edited by SED-SCRIPT, then checks that
# `xuanxue -in $D EXTRA-ARGS` fails as bad input at 1 and 2 ranks and that
# the run directory was not created.
bad_deck() {
  local name=$1 script=$2 prefix=$3
  shift 3
  local hints=() extra=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do
    hints+=("$1")
    shift
  done
  [ $# -gt 0 ] && shift && extra=("$@")
  begin "$name"
  sed -e "$script" "$GOOD" >"$D"
  local np
  for np in 1 2; do
    rm -rf "$RUN"
    expect_bad "$np" "$prefix" "${hints[@]}" -- -in "$D" "${extra[@]}"
    expect_absent "$RUN" "np $np: a bad deck must not create the run directory"
  done
}

# Positive control: the good deck runs, so each failure below is the edit's.
begin "good deck trains (control)"
expect_ok 1 -in "$GOOD"
check [ -s "$RUN/metrics.jsonl" ] || fail "no metrics.jsonl after a good run"
rm -rf "$RUN"

bad_deck "unknown command, with did-you-mean" 's/^seed 1$/sed 1/' \
  "$D:4: unknown command 'sed'" "(expected one of: seed," "(did you mean 'seed'?)"

bad_deck "unknown keyword, with did-you-mean" 's/ valid 0.1 / vlaid 0.1 /' \
  "$D:7: unknown keyword 'vlaid' for 'data bytes'" "(expected one of: valid, tokenizer, batch, workers, queue, shuffle, chaos_seed, common, common_rate, partition, noise_rank)" \
  "(did you mean 'valid'?)"

bad_deck "malformed integer" 's/ batch 2 / batch 2x /' \
  "$D:7: bad value '2x' for 'batch'" "(expected an integer)"

bad_deck "optimizer moments of a type AdamW does not keep" 's/^run /optimizer adamw moments fp16\nrun /' \
  "$D:11: bad value 'fp16' for 'moments'" "(expected one of: fp32, bf16)"

# A command continued with '&' is reported at the line where it starts.
bad_deck "malformed integer on a continued line" 's/ ffn 64 / ffn 6.4 /' \
  "$D:5: bad value '6.4' for 'ffn'" "(expected an integer)"

bad_deck "malformed real" 's/^peak_gflops 50$/peak_gflops fast/' \
  "$D:8: bad value 'fast' for 'peak_gflops'" "(expected a number)"

bad_deck "bad choice: checkpoint's writer" 's/^run /checkpoint every 2 writer rank1\nrun /' \
  "$D:11: bad value 'rank1' for 'writer'" "(expected one of: collective, rank0)"

bad_deck "bad choice: compress's exchange" 's/^run /compress topk 0.1 exchange ring\nrun /' \
  "$D:11: bad value 'ring' for 'exchange'" "(expected one of: allgather, partitioned)"

bad_deck "bad choice: attention_kernel" 's/^run /attention_kernel fast\nrun /' \
  "$D:11: unknown kind 'fast' for 'attention_kernel'" "(expected one of: auto, packed, flash)"

bad_deck "out-of-range value" 's/ valid 0.1 / valid 0.9 /' \
  "$D:7: value 0.9 for 'valid' is out of range" "(expected a fraction in (0, 0.5], or a validation shard)"

bad_deck "out-of-range value from -var" '' \
  "$D:11: value 0 for 'steps' is out of range" "(expected >= 1)" -- -var steps 0

bad_deck "malformed value from -var" '' \
  "$D:11: bad value 'abc' for 'steps'" "(expected an integer)" -- -var steps abc

bad_deck "missing keyword value" 's/ log_every 1$/ log_every/' \
  "$D:9: keyword 'log_every' needs a value" "(expected an integer)"

bad_deck "missing positional value" 's/^seed 1$/seed/' \
  "$D:4: 'seed' needs a value" "(expected an integer)"

bad_deck "missing required keyword" 's/ seq 16 / /' \
  "$D:5: 'model dense' is missing keyword 'seq'" "(expected model " "vocab V dim C layers L heads H ffn F seq T"

bad_deck "dim not divisible by heads" 's/ heads 2 / heads 3 /' \
  "$D:5: 'dim' 32 is not divisible by 'heads' 3" "(expected dim % heads == 0)"

bad_deck "undefined variable, with did-you-mean" 's/^run \${steps}$/run ${step}/' \
  "$D:11: undefined variable 'step'" "(expected a 'variable step VALUE' line above it or -var step VALUE)" \
  "(did you mean 'steps'?)"

bad_deck "missing include file" 's/^$/include missing.deck/' \
  "$D:3: cannot open included deck '$T/missing.deck'" "(expected a readable file)"

# An error inside an included deck names that deck and its own line.
printf '# included by deck.deck\neval every -1 batches 1\n' >"$T/part.deck"
bad_deck "error inside an included deck" 's/^$/include part.deck/' \
  "$T/part.deck:2: value -1 for 'every' is out of range" "(expected >= 0)"

bad_deck "include cycle" 's/^$/include deck.deck/' \
  "$D:3: include cycle" "(expected no deck to include itself)"

bad_deck "missing data file" "s#^data bytes [^ ]*#data bytes $T/missing.txt#" \
  "$D:7: cannot read data file '$T/missing.txt'" "(expected a readable file"

bad_deck "data file is a directory" "s#^data bytes [^ ]*#data bytes $T#" \
  "$D:7: cannot read data file '$T'" "(expected a readable file"

bad_deck "no run command" '/^run /d' \
  "$D:10: no run command: nothing to do" "(expected at least one 'run N' line)"

bad_deck "run before model" '/^model /,/continued/d' \
  "$D:9: 'run' before any 'model' command" "(expected a model line above the run)"

bad_deck "model changes between runs" '$a model dense vocab 256 dim 64 layers 1 heads 2 ffn 64 seq 16\nrun 1' \
  "$D:12: model cannot change after the first run" "(expected the same 'model' line, or none)"

# A model far beyond any node (about 1.1e12 parameters, 16 TiB per rank) is
# refused by its memory plan on every rank, before the model allocates
# anything: one message, not Kokkos' failed allocation from inside it.
HUGE='s/ dim 32 layers 1 / dim 65536 layers 64 /'
bad_deck "a model that cannot fit in this node's memory" "$HUGE" \
  "$D: memory: the plan for shard off needs 16" "MemAvailable" "no sharding level fits" "(expected a deck that fits"
bad_deck "a model that cannot fit in -device-gb" "$HUGE" \
  "$D: memory: the plan for shard off needs 16" "over the limit of 80.00 GiB (-device-gb 80)" "no sharding level fits" \
  -- -device-gb 80
bad_deck "a tiny model over a tiny -device-gb" '' \
  "$D: memory: the plan for shard off needs" "(-device-gb 0.0001)" "no sharding level fits" -- -device-gb 0.0001

# About 0.5e9 parameters, 8 GiB per rank in fp32: over 7 GiB, which
# sharding the optimizer state over 2 ranks meets.
begin "a model that sharding would fit names the level"
sed -e 's/ dim 32 layers 1 / dim 4096 layers 8 /' "$GOOD" >"$D"
expect_bad 2 "$D: memory: the plan for shard off needs 8" "over the limit of 7.00 GiB (-device-gb 7)" \
  "the least sharded level that would fit is shard optimizer" -- -in "$D" -device-gb 7
expect_absent "$RUN" "a refused run must not create the run directory"
# The deck's own level is what a run is held to: with shard optimizer it fits.
sed -e 's/ dim 32 layers 1 / dim 4096 layers 8 /' -e 's/^run /shard optimizer\nrun /' "$GOOD" >"$D"
expect_ok 2 -in "$D" -dry-run -device-gb 7
check grep -q -E '^  optimizer +.* yes  <- the deck.s$' "$T/out" || fail "the deck's level (optimizer) is not marked as fitting"

begin "the dry run plans what a run refuses, at 1 and 64 ranks"
sed -e "$HUGE" "$GOOD" >"$D"
expect_ok 1 -in "$D" -dry-run -device-gb 141
check grep -q -E '^  params +.* no$' "$T/out" || fail "no params row that does not fit at one rank"
check grep -q -F "no level fits" "$T/out" || fail "no verdict that nothing fits"
expect_ok 2 -in "$D" -dry-run -ranks 64 -device-gb 600
check grep -q -F "64 rank(s)" "$T/out" || fail "-ranks 64 not planned"
check grep -q -F "smallest level that fits: params" "$T/out" || fail "no params verdict at 64 ranks"
expect_absent "$RUN" "a dry run must not create the run directory"

# moe ... ep N: a world (or a dry run's -ranks) that is no whole number of
# expert-parallel groups is refused naming the moe line, at 1 and 2 ranks
# (ep 4 divides neither), before anything is allocated.
MOE='s/ layers 1 / layers 2 /; s/^run /moe on routed 4 topk 2 ffn 16 ep 4\nrun /'
bad_deck "moe ep that does not divide the ranks" "$MOE" \
  "$D:11: moe ep 4 does not divide the " "ranks of this run" "(expected a world size that is a multiple of ep"
bad_deck "moe ep that does not divide -ranks of a dry run" "$MOE" \
  "$D:11: moe ep 4 does not divide the 6 ranks planned" \
  "(expected a world size that is a multiple of ep, or an ep that divides 6 and routed 4)" \
  -- -dry-run -ranks 6
# pipeline stages P: the layers must cut into P stages (at the run line), and
# the world into P x ep x dp ranks (at start-up); sampling is refused under
# P > 1, no rank holding the whole model (docs/SCALING.md).
bad_deck "pipeline stages that do not divide the layers" 's/^run /pipeline stages 2\ncheckpoint at_end no\nrun /' \
  "$D:11: pipeline stages 2 does not divide the model's 1 layers" "(expected stages x virtual dividing layers"
bad_deck "pipeline dualpipev without its V" 's/ layers 1 / layers 4 /; s/^run /pipeline stages 2 schedule dualpipev micro 4\ncheckpoint at_end no\nrun /' \
  "$D:11: pipeline schedule dualpipev with virtual 1" "(expected virtual 2"
bad_deck "pipeline 1f1b with fewer micro-batches than stages" 's/ layers 1 / layers 2 /; s/^run /pipeline stages 2 schedule 1f1b micro 1\ncheckpoint at_end no\nrun /' \
  "$D:11: pipeline 'micro' 1 is fewer than 'stages' 2 with schedule 1f1b" "(expected micro >= stages"
bad_deck "pipeline stages that do not fill the ranks" 's/ layers 1 / layers 4 /; s/^run /pipeline stages 4 micro 2\ncheckpoint at_end no\nrun /' \
  "$D:11: pipeline stages 4 x moe ep 1 does not fill the " "ranks of this run" "(expected a world size that is a multiple of stages x ep"
bad_deck "pipeline stages with sampling" 's/ layers 1 / layers 2 /; s/^run /pipeline stages 2 micro 2\nsample every 2\nrun /' \
  "$D:11: pipeline stages 2 with sample every 2 ($D:12): sampling is not built with pipeline stages yet" "(expected no sample line"
bad_deck "moe ep that does not divide routed" 's/^run /moe on routed 4 topk 2 ffn 16 ep 3\nrun /' \
  "$D:11: 'routed' 4 is not divisible by 'ep' 3" "(expected routed % ep == 0"
bad_deck "moe ep with sync local" 's/^run /moe on routed 4 topk 2 ffn 16 ep 2\nsync local 2\nrun /' \
  "$D:13: moe ep 2 ($D:11) with sync local ($D:12)" "(expected sync dense or accumulate over topology full"

begin "the dry run plans ep's groups"
sed -e "$MOE" "$GOOD" >"$D"
expect_ok 1 -in "$D" -dry-run -ranks 8
check grep -q -F "8 rank(s), ep 4: experts sharded over their D = 2 holder(s)" "$T/out" || fail "no ep 4 over 8 ranks"
check grep -q -F "each rank holds 1 of every" "$T/out" || fail "no experts per rank"
expect_absent "$RUN" "a dry run must not create the run directory"

begin "missing deck file"
for np in 1 2; do
  expect_bad "$np" "$T/missing.deck: cannot open deck" "(expected a readable file)" -- -in "$T/missing.deck"
done

begin "deck is a directory"
for np in 1 2; do
  expect_bad "$np" "$T: cannot open deck" "(expected a readable file)" -- -in "$T"
done
expect_absent "$RUN" "a missing deck must not create the run directory"

finish
