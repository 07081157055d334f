#!/usr/bin/env bash
# Rules of the layers that includes cannot express (docs/ARCHITECTURE.md, "Layers"):
#   train/ decides what the ranks agree on and issues no collective or message
#   itself: those are comm/'s (agree.h, the strategies, placement_mpi.h).
# Usage: layer_rules.sh SOURCE_DIR
set -u
src=${1:?usage: layer_rules.sh SOURCE_DIR}/src
calls='MPI_(I?allreduce|I?reduce|I?bcast|I?allgatherv?|I?gatherv?|I?scatterv?|I?alltoallv?|I?reduce_scatter(_block)?|I?barrier|I?send|I?recv|I?sendrecv|I?ssend|Put|Get|Accumulate)\b'
found=$(grep -rnEi "$calls" "$src/train" --include='*.cpp' --include='*.h' | grep -v '^[^:]*:[0-9]*: *//')
if [ -n "$found" ]; then
  echo "layer_rules: train/ issues MPI traffic itself (expected it through comm/: agree.h, a strategy, placement_mpi.h):"
  echo "$found"
  exit 1
fi
echo "layer_rules: train/ issues no collective or message ($(ls "$src"/train/*.{cpp,h} | wc -l) files)"
