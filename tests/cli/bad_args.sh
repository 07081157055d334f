#!/usr/bin/env bash
# Bad command lines: exit code 2, one message naming the option, and the usage.
# usage: bad_args.sh XUANXUE [MPIEXEC]
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CORPUS=$T/corpus.txt
RUN=$T/run
DECK=$T/deck.deck
make_corpus "$CORPUS"
make_deck "$DECK" "$CORPUS" "$RUN"
USAGE="usage: xuanxue -in DECK"

# bad_args NAME PREFIX [HINT...] -- ARGS...: at 1 and 2 ranks; the usage is
# printed once and the run directory is not created.
bad_args() {
  local name=$1
  shift
  begin "$name"
  local np
  for np in 1 2; do
    expect_bad "$np" "$@"
    local n
    n=$(occurrences "$USAGE" "$T/err")
    check [ "$n" -eq 1 ] || fail "np $np: the usage appears $n times in stderr (expected once)"
    expect_absent "$RUN" "np $np: a bad command line must not create the run directory"
  done
}

bad_args "unknown option, with did-you-mean" \
  "command line: unknown option '-inn'" "(did you mean '-in'?)" "$USAGE" -- -in "$DECK" -inn x
bad_args "unknown option after a good command line" \
  "command line: unknown option '--steps'" "$USAGE" -- -in "$DECK" --steps 3
bad_args "no deck" \
  "command line: no deck given" "(expected -in DECK)" "$USAGE" -- -var steps 3
bad_args "-resume without its value" \
  "command line: '-resume' needs 1 value(s)" "$USAGE" -- -in "$DECK" -resume
bad_args "-var with one value" \
  "command line: '-var' needs 2 value(s)" "$USAGE" -- -in "$DECK" -var steps
bad_args "-in without its value" \
  "command line: '-in' needs 1 value(s)" "$USAGE" -- -in
bad_args "-ranks not a number" \
  "command line: bad value 'x' for -ranks" "(expected -ranks N, an integer N >= 1)" "$USAGE" -- -in "$DECK" -dry-run -ranks x
bad_args "-ranks zero" \
  "command line: bad value '0' for -ranks" "(expected -ranks N, an integer N >= 1)" "$USAGE" -- -in "$DECK" -dry-run -ranks 0
bad_args "-ranks not an integer" \
  "command line: bad value '2.5' for -ranks" "(expected -ranks N, an integer N >= 1)" "$USAGE" -- -in "$DECK" -dry-run -ranks 2.5
bad_args "-ranks without its value" \
  "command line: '-ranks' needs 1 value(s)" "$USAGE" -- -in "$DECK" -dry-run -ranks
bad_args "-ranks without -dry-run" \
  "command line: -ranks plans without launching" "(expected -dry-run -ranks N)" "$USAGE" -- -in "$DECK" -ranks 8
bad_args "-plan with a bad value" \
  "command line: bad -plan 'P=0 shard=optimizer': P=0 is not an integer >= 1" \
  "(expected -plan \"KEY=V1,V2 ...\" with keys P, ep, shard, recompute, micro, schedule" "$USAGE" \
  -- -in "$DECK" -dry-run -plan "P=0 shard=optimizer"
bad_args "-plan with an unknown key" \
  "command line: bad -plan 'stages=2': unknown key 'stages'" "$USAGE" -- -in "$DECK" -dry-run -plan stages=2
bad_args "-plan without -dry-run" \
  "command line: -plan plans without launching" "(expected -dry-run -plan GRID)" "$USAGE" -- -in "$DECK" -plan P=2
bad_args "-device-gb negative" \
  "command line: bad value '-1' for -device-gb" "(expected -device-gb G, GiB > 0)" "$USAGE" -- -in "$DECK" -device-gb -1
bad_args "-device-gb not a number" \
  "command line: bad value '80GB' for -device-gb" "(expected -device-gb G, GiB > 0)" "$USAGE" -- -in "$DECK" -device-gb 80GB

finish
