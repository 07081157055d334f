#!/usr/bin/env bash
# Preemption under a real Slurm: brings up a one-node cluster here
# (tools/slurm-local), trains a tiny deck once without interruption (mpiexec,
# the reference), then submits jobs/train.sbatch with the same deck on 2
# ranks, preempts it after its first checkpoint the way Slurm warns a job
# (USR1 to the batch script, as --signal=B:USR1@120 does), and checks that
#   (a) xuanxue stopped with a checkpoint ("stopped at step N on SIGUSR1"),
#       the script requeued the job, and the second start resumed from that
#       checkpoint;
#   (b) the loss and gradient norm of every step, and the PERFORMANCE line's
#       final_loss, equal the reference's exactly;
#   (c) the stop took less than KillWait (30 s) and the whole job less than
#       DEADLINE seconds.
# XX_SLURM_PREEMPT=requeue preempts with `scontrol requeue JOBID` instead
# (Slurm's SIGTERM to the whole job, the path of scancel and of preemption):
# then the stop is "on SIGTERM" and Slurm, not the script, requeues.
# Slurm is stopped at the end in every case. Needs root (Slurm runs as root
# here) and Debian's slurm-wlm and munge (tools/setup-deps): a missing
# package is a failure, not a skip; only a non-root user skips (exit 77).
#
# usage: preempt.sh XUANXUE [MPIEXEC]
set -u
XX=$(readlink -f "${1:?usage: $0 XUANXUE [MPIEXEC]}")
MPIEXEC=${2:-mpiexec}
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
DEADLINE=${XX_SLURM_DEADLINE:-150}   # seconds from submission to the job's end
STEPS=100
PREEMPT=${XX_SLURM_PREEMPT:-usr1}   # usr1 | requeue
case "$PREEMPT" in
  usr1) stop_signal=SIGUSR1 ;;
  requeue) stop_signal=SIGTERM ;;
  *) echo "FAIL: XX_SLURM_PREEMPT=$PREEMPT (expected usr1 or requeue)" >&2; exit 2 ;;
esac
CKPT_EVERY=20

FAILS=0
fail() { echo "FAIL: $*" >&2; FAILS=$((FAILS + 1)); }
note() { echo "--- $*"; }
now() { date +%s.%N; }
seconds_since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

for b in munged mungekey slurmctld slurmd sbatch scontrol scancel squeue; do
  if ! command -v "$b" >/dev/null; then
    echo "FAIL: $b is not installed: this test needs Debian's slurm-wlm and munge (run tools/setup-deps)" >&2
    exit 1
  fi
done
if [ "$(id -u)" -ne 0 ]; then
  echo "SKIPPED: tools/slurm-local runs Slurm as root (SlurmUser=root); this user is $(id -un)" >&2
  exit 77
fi

T=$(mktemp -d "${TMPDIR:-/tmp}/xx-slurm.XXXXXX") || exit 1
cleanup() {
  "$REPO/tools/slurm-local" stop "$T/slurm" >/dev/null 2>&1
  if [ "$FAILS" -eq 0 ]; then rm -rf "$T"; else echo "kept for inspection: $T" >&2; fi
}
trap cleanup EXIT
trap 'exit 1' INT TERM

# A port of our own, so that another Slurm on this machine (or a second run
# of this test) is left alone: below the kernel's ephemeral range (an
# outgoing connection, MPI's or UCX's, may hold any port in it without
# listening), and held by no socket in any state.
ephemeral=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
port=$((10000 + $$ % (ephemeral - 10002)))
while ss -tanH 2>/dev/null | awk '{ print $4 }' | grep -q -E ":($port|$((port + 1)))\$"; do
  port=$((port + 2))
done
export SLURM_LOCAL_PORT=$port SLURM_CONF="$T/slurm/slurm.conf"
# The job's environment for the reference too: jobs/train.sbatch sources
# tools/env.sh, and its OPENBLAS_CORETYPE picks other BLAS kernels, whose
# roundings differ in the last bits.
source "$REPO/tools/env.sh"

note "start a one-node Slurm (port $port)"
if ! "$REPO/tools/slurm-local" start "$T/slurm"; then
  fail "tools/slurm-local start failed"
  exit 1
fi

# The deck: a few seconds of training, a checkpoint every CKPT_EVERY steps.
# The preemption comes right after the first one; the checkpoints after it
# keep even a quiet machine (2-3 ms a step) busy long enough to be caught.
for ((i = 1; i <= 400; ++i)); do
  printf 'Line %d: the quick brown fox jumps over the lazy dog, again.\n' "$i"
done >"$T/corpus.txt"
cat >"$T/preempt.deck" <<EOF
# tests/slurm/preempt.sh: a small dense model, a checkpoint every $CKPT_EVERY steps
variable run_dir $T/run
seed 1
model dense vocab 256 dim 64 layers 2 heads 2 ffn 128 seq 32
data bytes $T/corpus.txt valid 0.1 batch 4 workers 1
optimizer adamw lr 3e-3
output dir \${run_dir} log_every 1
eval every 0 batches 1
checkpoint every $CKPT_EVERY
run $STEPS
EOF

note "reference: $STEPS steps without interruption (mpiexec, 2 ranks)"
t0=$(now)
timeout 300 "$MPIEXEC" --oversubscribe --bind-to none -n 2 "$XX" -in "$T/preempt.deck" \
  -var run_dir "$T/ref" >"$T/ref.out" 2>&1
rc=$?
echo "    $(seconds_since "$t0") s, exit code $rc"
if [ "$rc" -ne 0 ]; then
  fail "reference run: exit code $rc"
  tail -n 20 "$T/ref.out" >&2
  exit 1
fi

note "submit jobs/train.sbatch (2 ranks)"
t_submit=$(now)
jid=$(cd "$REPO" && sbatch --parsable --job-name=xx-preempt --ntasks-per-node=2 --time=10 \
  --output="$T/job.log" --export="ALL,DECK=$T/preempt.deck,XUANXUE=$XX" \
  jobs/train.sbatch -var run_dir "$T/job") || { fail "sbatch refused the job"; exit 1; }
echo "    job $jid"

job_field() {  # job_field NAME: a field of scontrol show job (JobState, Restarts, Reason, ExitCode)
  scontrol show job "$jid" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$1=//p" | head -n 1
}
past_deadline() { awk -v s="$(seconds_since "$t_submit")" -v d="$DEADLINE" 'BEGIN { exit !(s > d) }'; }

# Preempt once the first checkpoint is complete: `latest` names it.
until [ -s "$T/job/ckpt/latest" ]; do
  past_deadline && { fail "no checkpoint after $DEADLINE s"; tail -n 30 "$T/job.log" >&2; exit 1; }
  state=$(job_field JobState)
  case "$state" in PENDING | CONFIGURING | RUNNING) ;; *)
    fail "job $jid is $state before its first checkpoint"; tail -n 30 "$T/job.log" >&2; exit 1 ;;
  esac
  sleep 0.05
done
t_signal=$(now)
if [ "$PREEMPT" = usr1 ]; then
  note "first checkpoint $(cat "$T/job/ckpt/latest") after $(seconds_since "$t_submit") s: USR1 to the batch script"
  scancel --batch --signal=USR1 "$jid" || fail "scancel --batch --signal=USR1 $jid failed"
else
  note "first checkpoint $(cat "$T/job/ckpt/latest") after $(seconds_since "$t_submit") s: scontrol requeue"
  scontrol requeue "$jid" || fail "scontrol requeue $jid failed"
fi

# The job stops, is requeued and waits out Slurm's delay before a requeued
# job may start again (BeginTime, about 2 minutes in Slurm 22.05); let it
# start sooner, as an administrator could, but not at once: slurmd revokes the
# old run's credential with a timestamp in whole seconds, and a start within
# that second is killed ("Job credential revoked").
released=0
pending_since=""
stop_s=""
while true; do
  state=$(job_field JobState)
  if [ -z "$stop_s" ] && grep -q 'stopped at step' "$T/job.log" 2>/dev/null; then
    stop_s=$(seconds_since "$t_signal")
  fi
  if [ "$state" = PENDING ] && [ "$(job_field Restarts)" = 1 ] && [ "$released" -eq 0 ]; then
    [ -n "$pending_since" ] || pending_since=$(now)
    if awk -v s="$(seconds_since "$pending_since")" 'BEGIN { exit !(s >= 3) }'; then
      scontrol update JobId="$jid" StartTime=now && released=1
    fi
  fi
  case "$state" in COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | BOOT_FAIL | DEADLINE) break ;; esac
  if past_deadline; then
    fail "job $jid still $state after $DEADLINE s"
    break
  fi
  sleep 0.2
done
total_s=$(seconds_since "$t_submit")
echo "    job $jid: $state, exit code $(job_field ExitCode), restarts $(job_field Restarts), $total_s s from submission"

note "(a) stopped with a checkpoint, requeued, resumed from it"
[ "$state" = COMPLETED ] || fail "job state $state (expected COMPLETED)"
[ "$(job_field Restarts)" = 1 ] || fail "restarts $(job_field Restarts) (expected exactly 1)"
stop_line=$(grep -m1 -E "stopped at step [0-9]+ on $stop_signal" "$T/job.log")
stop_step=$(sed -n 's/.*stopped at step \([0-9]*\).*/\1/p' <<<"$stop_line")
resume_line=$(grep -m1 -E 'resumed from .*step_[0-9]+\.h5 at step [0-9]+' "$T/job.log")
resume_step=$(sed -n 's/.* at step \([0-9]*\).*/\1/p' <<<"$resume_line")
echo "    $stop_line"
echo "    $resume_line"
[ -n "$stop_step" ] ||
  fail "no 'stopped at step N on $stop_signal' in the job log (did the run end before the preemption reached it?)"
[ -n "$resume_step" ] || fail "no 'resumed from ... at step N' in the job log"
if [ -n "$stop_step" ] && [ -n "$resume_step" ]; then
  [ "$stop_step" -ge "$CKPT_EVERY" ] && [ "$stop_step" -lt "$STEPS" ] ||
    fail "stopped at step $stop_step (expected mid-run: from $CKPT_EVERY to $((STEPS - 1)))"
  [ "$resume_step" -eq "$stop_step" ] ||
    fail "resumed at step $resume_step (expected the stop checkpoint, step $stop_step)"
fi
if [ "$PREEMPT" = usr1 ]; then
  grep -q "train.sbatch: requeued job $jid" "$T/job.log" || fail "train.sbatch did not requeue the job"
fi
# The stop marker: the batch script saw a clean stop (and exits 0 for it,
# whatever srun says after Slurm's SIGTERM).
grep -q "train.sbatch: stopped cleanly: .*\"signal\":\"$stop_signal\"" "$T/job.log" ||
  fail "train.sbatch did not see xuanxue's stop marker (expected 'stopped cleanly: {...$stop_signal...}')"
grep -E "train.sbatch: (xuanxue exited|stopped cleanly|exit 0, not)" "$T/job.log" | head -n 3 | sed 's/^/    /'
grep -q "train.sbatch: job $jid restart 1:" "$T/job.log" || fail "no second start (restart 1) in the job log"

note "(b) the loss curve equals the uninterrupted run's"
ref_final=$(sed -n 's/^PERFORMANCE.* final_loss=\([^ ]*\).*/\1/p' "$T/ref.out")
job_final=$(sed -n 's/^PERFORMANCE.* final_loss=\([^ ]*\).*/\1/p' "$T/job.log" | tail -n 1)
echo "    final_loss: reference $ref_final, preempted job $job_final"
[ -n "$ref_final" ] && [ "$ref_final" = "$job_final" ] ||
  fail "final_loss $job_final (expected $ref_final, the uninterrupted run's)"
# metrics.jsonl holds full precision; a step written twice (before the stop
# and again after the resume) counts with its last record.
/usr/bin/python3 - "$T/ref/metrics.jsonl" "$T/job/metrics.jsonl" "$STEPS" <<'EOF' || fail "metrics.jsonl differs"
import json, sys
def curve(path):
    steps = {}
    for line in open(path):
        r = json.loads(line)
        steps[r["step"]] = (r["loss"], r["grad_norm"])
    return steps
ref, job, n = curve(sys.argv[1]), curve(sys.argv[2]), int(sys.argv[3])
bad = [s for s in range(1, n + 1) if ref.get(s) is None or ref.get(s) != job.get(s)]
for s in bad[:5]:
    print(f"    step {s}: loss, grad_norm {job.get(s)} (expected {ref.get(s)})", file=sys.stderr)
print(f"    {n - len(bad)} of {n} steps bit-identical (loss and grad_norm)")
sys.exit(1 if bad else 0)
EOF

note "(c) time"
echo "    stop after the preemption: ${stop_s:-never} s; whole job: $total_s s (bounds: 30 s, $DEADLINE s)"
[ -n "$stop_s" ] && awk -v s="$stop_s" 'BEGIN { exit !(s < 30) }' ||
  fail "xuanxue did not stop within KillWait (30 s) of the preemption (took ${stop_s:-forever} s)"
awk -v s="$total_s" -v d="$DEADLINE" 'BEGIN { exit !(s <= d) }' || fail "the job took $total_s s (bound $DEADLINE s)"

if [ "$FAILS" -ne 0 ]; then
  echo "--- job log (without step lines)" >&2
  grep -v -E '^step ' "$T/job.log" | tail -n 60 >&2
  echo "=== $FAILS failure(s)"
  exit 1
fi
echo "=== OK"
