#!/usr/bin/env bash
# Launches xuanxue on N ranks of one workstation or allocation with mpirun.
#
#   jobs/mpirun.sh N DECK [xuanxue args...]
#   e.g. jobs/mpirun.sh 2 input/tiny.deck -var steps 50 -var run_dir runs/try
#        jobs/mpirun.sh 2 input/tiny.deck -resume auto   # continue from RUN_DIR/ckpt
#
# Run it from the repository root: deck paths (data, run_dir) are relative to
# the working directory. The environment is tools/env.sh (one BLAS thread per
# rank, OPENBLAS_CORETYPE where needed, Open MPI as root). One rank per core:
# --bind-to core while N <= nproc; beyond that the ranks share cores
# (--oversubscribe --bind-to none), which is for testing, not for timing.
#
# Stopping: Open MPI 4.1's mpirun passes SIGUSR1, SIGUSR2 and SIGTERM on to
# every rank, so `kill -USR1 <mpirun pid>` (or plain kill) has xuanxue
# checkpoint and stop at the next step boundary; resume with -resume auto.
#
# The binary is build/xuanxue, or XUANXUE. Extra mpirun flags go in
# MPIRUN_ARGS. On machines without InfiniBand, where Open MPI's UCX layer
# finds no network device and the run stops at start-up (e.g. "pml_ucx: no
# usable transports" or "PML ucx cannot be selected"), let UCX use any device
# and only shared memory:
#   UCX_TLS=self,sm MPIRUN_ARGS="--mca pml_ucx_tls any --mca pml_ucx_devices any -x UCX_TLS" \
#     jobs/mpirun.sh 2 input/tiny.deck
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
usage="usage: jobs/mpirun.sh N DECK [xuanxue args...]"
if [ $# -lt 2 ]; then echo "$usage" >&2; exit 2; fi
n="$1" deck="$2"
shift 2
if ! [[ "$n" =~ ^[1-9][0-9]*$ ]]; then
  echo "jobs/mpirun.sh: '$n' ranks (expected a positive integer)" >&2; echo "$usage" >&2; exit 2
fi
if [ ! -f "$deck" ]; then
  echo "jobs/mpirun.sh: $deck: no such deck (paths are relative to $(pwd); expected e.g. input/tiny.deck)" >&2; exit 2
fi
bin="${XUANXUE:-$root/build/xuanxue}"
if [ ! -x "$bin" ]; then echo "jobs/mpirun.sh: $bin: not built (expected tools/build first)" >&2; exit 2; fi

source "$root/tools/env.sh"
if [ "$n" -le "$(nproc)" ]; then
  bind=(--bind-to core)
else
  bind=(--oversubscribe --bind-to none)
fi
# Ranks on other hosts see only the variables named with -x: one BLAS
# thread per rank there too.
env_flags=(-x OPENBLAS_NUM_THREADS -x OMP_NUM_THREADS)
[ -n "${OPENBLAS_CORETYPE:-}" ] && env_flags+=(-x OPENBLAS_CORETYPE)
# shellcheck disable=SC2086  # MPIRUN_ARGS is a list of flags
exec mpirun -n "$n" "${bind[@]}" "${env_flags[@]}" ${MPIRUN_ARGS:-} "$bin" -in "$deck" "$@"
