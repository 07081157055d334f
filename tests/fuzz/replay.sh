#!/usr/bin/env bash
# The checkpoint reader on the seed corpus' mutants (ctest fuzz_ckpt_replay;
# the libFuzzer target itself runs in tools/lab/fuzz). Real checkpoints of
# tiny runs (make_corpus.sh: base files, per-rank state full and diff, a
# delta next to its base, a file written by slabs), then
#   - each one as it is: read (exit 0, the positive control);
#   - cut at many offsets (the header, each tenth, one byte short): exit 2;
#   - one bit flipped at seeded offsets in the header, in the metadata and
#     anywhere: exit 0 (a bit HDF5 never reads) or 2;
#   - the hand-made bad files of xx_ckpt_forge (the findings: a
#     wrong-shape tensor, a tensor stored in another type (the fuzzer's one
#     crash), datasets larger than the file, array and
#     variable-length attributes, a delta based on itself, world_size 0, a
#     per-rank buffer one rank lacks): exit 2 with the case's message;
# all read by one xx_ckpt_read (MPI's start-up costs more than a read), which
# makes the reads of a resume and prints one line per file. A refusal must be
# one line (the message a resume prints, exit 2) that starts with the file's
# path; a signal, another exit code, a missing line or a hang (timeout) fails.
# usage: replay.sh XX_CKPT_READ XX_CKPT_FORGE XUANXUE [MPIEXEC]
set -u
here="$(cd "$(dirname "$0")" && pwd)"
READ=$(realpath "${1:?usage: replay.sh XX_CKPT_READ XX_CKPT_FORGE XUANXUE [MPIEXEC]}")
FORGE=$(realpath "${2:?}")
XX=${3:?}
MPIEXEC=${4:-mpiexec}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
READ_TIMEOUT=${XX_REPLAY_TIMEOUT:-240}  # seconds for every read together: a hang is a failure
T=$(mktemp -d "${TMPDIR:-/tmp}/xx-replay.XXXXXX") || exit 1
trap 'rm -rf "$T"' EXIT
FAILS=0
fail() {
  echo "FAIL: $*" >&2
  FAILS=$((FAILS + 1))
}

echo "--- seed corpus (make_corpus.sh)"
bash "$here/make_corpus.sh" "$T/c" "$XX" "$MPIEXEC" || { echo "FAIL: make_corpus.sh" >&2; exit 1; }
SEEDS=(dense/ckpt/step_00000002.h5 local_full/ckpt/step_00000003.h5 local_int8/ckpt/step_00000002.h5
       local_topk/ckpt/step_00000002.h5 sharded/ckpt/step_00000002.h5 moments_bf16/ckpt/step_00000002.h5)

# $T/cases: one line per file, "EXPECT<TAB>PATH<TAB>HINT": EXPECT read (the
# seeds as they are), refused (cut, forged: HINT in the message) or either
# (a flipped bit HDF5 may never read). Mutants lie next to their seed (a
# delta's base stays beside it): SEED.cut-OFFSET.h5, SEED.flip-OFFSET-BIT.h5.
for s in "${SEEDS[@]}"; do printf 'read\t%s\t\n' "$T/c/$s"; done >"$T/cases"
/usr/bin/python3 - "$T/c" "${SEEDS[@]}" >>"$T/cases" <<'PY'
import os, random, sys
root, seeds = sys.argv[1], sys.argv[2:]
rng = random.Random(20261205)
for s in seeds:
    path = os.path.join(root, s)
    data = open(path, "rb").read()
    n = len(data)
    stem = path[:-3]
    # the superblock, the root group, the first metadata, each tenth, the tail
    cuts = sorted({0, 1, 8, 40, 96, 200, 512, 1024, 2048, 4096, n // 3, n // 2, n - 4096, n - 1} |
                  {n * k // 10 for k in range(1, 10)})
    for c in cuts:
        if 0 <= c < n:
            out = f"{stem}.cut-{c}.h5"
            open(out, "wb").write(data[:c])
            print(f"refused\t{out}\t")
    # one bit in the superblock, in the first metadata blocks, anywhere
    flips = [rng.randrange(0, 96) for _ in range(4)] + [rng.randrange(96, 4096) for _ in range(6)] + \
            [rng.randrange(0, n) for _ in range(6)]
    for at in sorted(set(flips)):
        bit = rng.randrange(8)
        out = f"{stem}.flip-{at}-{bit}.h5"
        b = bytearray(data)
        b[at] ^= 1 << bit
        open(out, "wb").write(bytes(b))
        print(f"either\t{out}\t")
PY

# forge CASE SEED HINT: xx_ckpt_forge's CASE made from SEED, refused with HINT in the message.
forge() {
  local out="$T/c/${2%.h5}.$1.h5"
  "$FORGE" "$1" "$T/c/$2" "$out" || { fail "xx_ckpt_forge $1 failed"; return; }
  printf 'refused\t%s\t%s\n' "$out" "$3" >>"$T/cases"
}
forge shape dense/ckpt/step_00000002.h5 "has shape [3] (expected ["
forge wide_float dense/ckpt/step_00000002.h5 "is stored as float of 8 bytes (expected float of 4 bytes"
forge huge_series dense/ckpt/step_00000002.h5 "dataset '/train/huge' claims 1099511627776 values"
forge huge_buffer dense/ckpt/step_00000002.h5 "dataset '/buffers/huge' claims 68719476736 values"
forge array_attr dense/ckpt/step_00000002.h5 "attribute 'complete' holds 8000 values (expected one)"
forge array_string dense/ckpt/step_00000002.h5 "attribute 'format' holds 2000 values (expected one)"
forge vlen_string local_full/ckpt/step_00000003.h5 "attribute 'mode' is not a fixed-length string"
forge self_chain dense/ckpt/step_00000002.h5 "attribute 'chain_parent' is 'step_00000002.self_chain.h5'"
forge world_zero local_full/ckpt/step_00000003.h5 "attribute '/train/world_size' is 0 (expected 1 or more)"
forge extra_one_rank local_full/ckpt/step_00000003.h5 "rank 1 holds 0 values of 'foo'"

n=$(wc -l <"$T/cases")
echo "--- $n files read by one xx_ckpt_read: $(grep -c '^read' "$T/cases") seeds, $(grep -c 'cut-' "$T/cases") cut," \
  "$(grep -c 'flip-' "$T/cases") flipped, $(grep -c -v -e '^read' -e 'cut-' -e 'flip-' "$T/cases") forged"
mapfile -t files < <(cut -f2 "$T/cases")
timeout "$READ_TIMEOUT" "$READ" "${files[@]}" >"$T/out" 2>"$T/err"
rc=$?
case $rc in
  0 | 2) ;;
  124) fail "xx_ckpt_read did not finish within $READ_TIMEOUT s (a hang)" ;;
  *) fail "xx_ckpt_read ended with exit code $rc (a crash: expected 0 or 2)" ;;
esac
[ "$rc" -eq 0 ] && grep -q -v '^read' "$T/cases" && fail "xx_ckpt_read exited 0 though files must be refused"

# Each case against its line of the output, in order.
i=0
while IFS=$'\t' read -r expect path hint; do
  i=$((i + 1))
  line=$(sed -n "${i}p" "$T/out")
  IFS=$'\t' read -r got gotpath message <<<"$line"
  if [ -z "$line" ]; then
    fail "$path: no result (the read of this file crashed or hung the reader)"
    sed -n '1,15s/^/    stderr| /p' "$T/err" | grep -v '^    stderr| /' >&2
    break
  fi
  [ "$gotpath" = "$path" ] || { fail "line $i is for '$gotpath' (expected '$path': a message of more than one line?)"; break; }
  case $expect:$got in
    read:read | either:read | either:refused | refused:refused) ;;
    *) fail "$path: $got (expected $expect)${message:+: $message}"; continue ;;
  esac
  [ "$got" = refused ] || continue
  [ "${message#"$path: "}" != "$message" ] || fail "$path: the message does not start with the file's path: $message"
  [ -z "$hint" ] || [[ "$message" == *"$hint"* ]] || fail "$path: the message lacks '$hint': $message"
done <"$T/cases"
[ "$(wc -l <"$T/out")" -eq "$n" ] || fail "$(wc -l <"$T/out") result lines for $n files (expected one each)"
echo "=== $n files, $(grep -c '^refused' "$T/out") refused, $(grep -c '^read' "$T/out") read; $FAILS failure(s)"
[ "$FAILS" -eq 0 ]
