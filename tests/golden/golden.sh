#!/usr/bin/env bash
# Golden curves: every case of cases.txt trains 20 steps and its metrics
# (every field but the timings) must equal tests/golden/curves/NAME.jsonl bit
# for bit. A refactor keeps them; a change that means to move them records
# new ones and says why in its commit.
#
# Bits hold only where the curves were recorded: machine.txt names that CPU
# and GEMM kernel. On another machine (another CPU rounds its GEMMs and
# vector sums differently) every curve must agree within the tolerances of
# compare.py instead, and the check says so on its first line.
#
#   tests/golden/golden.sh check|record XUANXUE [MPIEXEC] [NAME...]
set -u
mode=${1:?usage: golden.sh check|record XUANXUE [MPIEXEC] [NAME...]}
XX=${2:?usage: golden.sh check|record XUANXUE [MPIEXEC] [NAME...]}
MPIEXEC=${3:-mpiexec}
shift 3 2>/dev/null || shift $#
only=("$@")
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
"$root/tools/prepare-data" >/dev/null || { echo "golden: tools/prepare-data failed" >&2; exit 1; }
data="$root/data/fortunes.txt"
T=$(mktemp -d "${TMPDIR:-/tmp}/xx-golden.XXXXXX") || exit 1
trap 'rm -rf "$T"' EXIT
mkdir -p "$here/curves"
fails=0 cases=0
machine_file="$here/machine.txt"
cpu=$(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
mode_told=""
# The machine: its CPU and the GEMM kernel a run's backends table names
# (the "gemm" row, without what follows the first ';').
fingerprint() { printf 'cpu: %s\ngemm: %s\n' "$cpu" "$(grep -m1 '^  gemm ' "$1" | sed 's/^  gemm *//; s/;.*//')"; }
while read -r name ranks deck args; do
  case "$name" in '' | '#'*) continue ;; esac
  if [ ${#only[@]} -gt 0 ] && [[ ! " ${only[*]} " =~ " $name " ]]; then continue; fi
  cases=$((cases + 1))
  case "$deck" in decks/*) deck="$here/$deck" ;; *) deck="$root/$deck" ;; esac
  run="$T/$name"
  # shellcheck disable=SC2086  # args is a list of -var pairs
  set -- -in "$deck" -var data "$data" -var run_dir "$run" -var log_every 1 $args
  if [ "$ranks" -eq 1 ]; then
    timeout 300 "$XX" "$@" </dev/null >"$T/$name.out" 2>&1
  else
    timeout 300 "$MPIEXEC" --oversubscribe --bind-to none -n "$ranks" "$XX" "$@" </dev/null >"$T/$name.out" 2>&1
  fi
  rc=$?
  if [ $rc -ne 0 ]; then
    echo "FAIL $name: exit $rc"; sed 's/^/    | /' "$T/$name.out" | tail -20; fails=$((fails + 1)); continue
  fi
  /usr/bin/python3 - "$run/metrics.jsonl" "$T/$name.jsonl" <<'PY'
import json, sys
timings = {"ms_per_step", "tokens_per_s", "mfu", "comm_s"}  # the only fields that may differ between runs
with open(sys.argv[1]) as f, open(sys.argv[2], "w") as out:
    for line in f:
        rec = {k: v for k, v in json.loads(line).items() if k not in timings}
        out.write(json.dumps(rec, sort_keys=True) + "\n")
PY
  golden="$here/curves/$name.jsonl"
  here_machine=$(fingerprint "$T/$name.out")
  if [ "$mode" = record ] && [ -z "$mode_told" ]; then
    printf '%s\n' "$here_machine" >"$machine_file"
    echo "recording on: $(echo "$here_machine" | tr '\n' ' ')"; mode_told=1
  elif [ -z "$mode_told" ]; then
    if [ -f "$machine_file" ] && [ "$here_machine" = "$(cat "$machine_file")" ]; then
      compare=exact; echo "mode exact: this is the machine that recorded the curves ($(tr '\n' ' ' <"$machine_file"))"
    else
      compare=close
      echo "mode close: recorded on $(tr '\n' ' ' <"$machine_file" 2>/dev/null || echo 'an unnamed machine'); this is $(echo "$here_machine" | tr '\n' ' ')"
      echo "           curves must agree within tests/golden/compare.py's tolerances, not bit for bit"
    fi
    mode_told=1
  fi
  if [ "$mode" = record ]; then
    cp "$T/$name.jsonl" "$golden"
    echo "recorded $name: $(wc -l <"$golden") records, final $(tail -1 "$golden" | cut -c1-120)"
  elif [ ! -f "$golden" ]; then
    echo "FAIL $name: no golden curve $golden"; fails=$((fails + 1))
  elif ! said=$(/usr/bin/python3 "$here/compare.py" "$compare" "$golden" "$T/$name.jsonl"); then
    echo "FAIL $name ($compare): $said"
    [ "$compare" = exact ] && diff "$golden" "$T/$name.jsonl" | head -4 | cut -c1-400 | sed 's/^/    /'
    fails=$((fails + 1))
  else
    echo "ok   $name ($(wc -l <"$golden") records${said:+; $said})"
  fi
done <"$here/cases.txt"
[ $cases -gt 0 ] || { echo "golden: no case matched" >&2; exit 1; }
echo "=== $cases case(s), $fails failure(s)"
[ $fails -eq 0 ]
