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
# Stopping: SIGTERM, SIGINT (Ctrl-C), SIGUSR1 or SIGUSR2 to this script has
# every rank checkpoint and stop at the next step boundary; resume with
# -resume auto. The script passes the first TERM or INT on to mpirun as USR1:
# Open MPI 4.1's mpirun forwards USR1 and USR2 to every rank at once, but
# answers a TERM or INT of its own by killing the job (TERM to the ranks a
# second later, KILL a second after that), too soon for a checkpoint of any
# size. A second signal is passed on as it is, and cuts the stop short.
# mpirun runs in a process group of its own, so a Ctrl-C reaches only this
# script; should the script die (kill -9, a timeout's SIGKILL), mpirun gets a
# SIGTERM (setpriv --pdeathsig) and ends the job.
#
# Exit status (README.md, "Exit codes"): 0 when the run ended, or when it
# stopped cleanly on a signal with its checkpoint on disk (rank 0 then writes
# a stop marker, src/resilience/signals.h, to the file this script names in
# XUANXUE_STOP_FILE, in the working directory, which every rank's host
# shares: mpirun's own status after a signal says nothing); 2 bad input,
# 3 unhealthy or hung, 4 a checkpoint could not be written, 1 a rank
# failed; 128 + N after a second signal N cut the stop short.
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

# The stop marker: absent unless this launch stops cleanly on a signal.
marker_dir=$PWD
[ -w "$marker_dir" ] || marker_dir=${TMPDIR:-/tmp}
marker=$(mktemp "$marker_dir/.xuanxue-stop.XXXXXX")
rm -f "$marker"
trap 'rm -f "$marker"' EXIT
export XUANXUE_STOP_FILE=$marker
env_flags+=(-x XUANXUE_STOP_FILE)

pid=""
signals=0
second=""
early=""
# shellcheck disable=SC2317  # reached through the traps
send() {  # send SIGNAL: the first TERM or INT as USR1, any other as it is
  if [ "$signals" -eq 1 ] && { [ "$1" = TERM ] || [ "$1" = INT ]; }; then
    echo "jobs/mpirun.sh: SIG$1: asking every rank to checkpoint and stop (passed to mpirun as SIGUSR1)" >&2
    kill -s USR1 "$pid" 2>/dev/null || true
  else
    kill -s "$1" "$pid" 2>/dev/null || true
  fi
}
# shellcheck disable=SC2317
forward() {  # forward SIGNAL (one that comes before mpirun's pid is known waits for it)
  signals=$((signals + 1))
  [ "$signals" -eq 2 ] && second=$1
  if [ -n "$pid" ]; then send "$1"; else early=$1; fi
}
for sig in TERM INT USR1 USR2; do
  # shellcheck disable=SC2064  # the signal's name, now
  trap "forward $sig" "$sig"
done

# In the background (so that a trap runs as soon as its signal comes) and,
# with job control, in its own process group (so that a terminal's Ctrl-C
# comes only here); stdin from /dev/null, which a background group may not
# read; a TERM to mpirun if this script dies (it no longer execs mpirun).
launcher=(mpirun)
setpriv --pdeathsig TERM true 2>/dev/null && launcher=(setpriv --pdeathsig TERM mpirun)
set -m
# shellcheck disable=SC2086  # MPIRUN_ARGS is a list of flags
"${launcher[@]}" -n "$n" "${bind[@]}" "${env_flags[@]}" ${MPIRUN_ARGS:-} "$bin" -in "$deck" "$@" </dev/null &
pid=$!
set +m
[ -z "$early" ] || send "$early"
while true; do
  wait "$pid" && status=0 || status=$?
  # wait returns early (status > 128) when a trapped signal arrives
  if [ "$status" -gt 128 ] && kill -0 "$pid" 2>/dev/null; then continue; fi
  break
done

if [ -s "$marker" ] && grep -q '"stopped":true' "$marker"; then
  [ "$status" -eq 0 ] || echo "jobs/mpirun.sh: every rank stopped cleanly with a checkpoint ($(cat "$marker")); exit 0, not mpirun's $status" >&2
  exit 0
fi
if [ "$status" -ne 0 ] && [ -n "$second" ]; then
  exit $((128 + $(kill -l "$second")))
fi
exit "$status"
