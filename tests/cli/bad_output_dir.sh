#!/usr/bin/env bash
# An `output dir` that cannot be a directory (it names an existing file, or a
# path under one) is a bad deck: exit code 2 and one message naming the deck
# line, the path and what was expected, before anything is written; the file
# in the way is left as it was. (Not a rank failure: no MPI_Abort, no exit 1.)
# usage: bad_output_dir.sh XUANXUE [MPIEXEC]
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CORPUS=$T/corpus.txt
GOOD=$T/good.deck
D=$T/deck.deck
make_corpus "$CORPUS"
make_deck "$GOOD" "$CORPUS" "$T/run"
FILE=$T/results.txt
printf 'results of an earlier job\n' >"$FILE"
SUM=$(sha256sum <"$FILE")

bad_output() {  # bad_output NAME OUTPUT-DIR
  begin "$1"
  sed -e "s#^output dir [^ ]*#output dir $2#" "$GOOD" >"$D"
  local np
  for np in 1 2; do
    expect_bad "$np" "$D:9: " "$2" "expected" -- -in "$D"
    check [ "$(sha256sum <"$FILE")" = "$SUM" ] || fail "np $np: $FILE was changed"
    check [ -f "$FILE" ] || fail "np $np: $FILE is no longer a regular file"
  done
}

bad_output "output dir is an existing file" "$FILE"
bad_output "output dir is under an existing file" "$FILE/run"

finish
