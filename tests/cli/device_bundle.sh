#!/usr/bin/env bash
# tools/device-bundle, proved without a GPU (issue 14/18): the host build packed the same way as the
# cuda build, unpacked with Python's standard library, and run at 2 ranks through the bundle's own
# Open MPI launcher in a mount namespace where every library the bundle carries is hidden on this
# machine (each bound over by an empty file, so a load that strays outside the bundle fails
# loudly), and Open MPI's, PMIx's, UCX's and HDF5's folders and launchers are empty: one rank
# without a launcher (as tools/device/checks.sh runs most stages), then 2 ranks, whose losses must
# equal a normal run's bit for bit. The bundle must be at most 60 MiB.
# usage: device_bundle.sh XUANXUE [MPIEXEC]
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="$(cd "$(dirname "$XX")" && pwd)"
PY=/usr/bin/python3

begin "pack the host build (tools/device-bundle --host)"
# xz at preset 1: the packing is what is proved here, not the ratio (CI packs the cuda build at 6).
check "$root/tools/device-bundle" --host --level 1 --build "$build" --out "$T/host.tar.xz" >"$T/pack.out" 2>&1 ||
  { fail "device-bundle failed: $(tail -5 "$T/pack.out")"; finish; }
head -1 "$T/pack.out" | sed 's/^/    /'
size=$(stat -c %s "$T/host.tar.xz")
check [ "$size" -le $((60 * 1024 * 1024)) ] || fail "the bundle is $size bytes, over 60 MiB"
check grep -q 'left out: libc.so.6: glibc' "$T/pack.out" || fail "it does not say glibc was left out"

begin "unpack with Python's standard library"
check $PY "$root/tools/device/unpack.py" "$T/host.tar.xz" "$T/u" >"$T/unpack.out" 2>&1 || fail "$(cat "$T/unpack.out")"
B="$T/u/xx"
for f in bin/xuanxue bin/unit_tests bin/mpi_tests env.sh MANIFEST input/deepseek-tiny.deck data/fortunes.txt \
  tools/device/checks.sh root/usr/bin/orterun; do
  check [ -e "$B/$f" ] || fail "$f missing from the bundle"
done
for f in "$B"/root/usr/lib/x86_64-linux-gnu/lib{c.so.6,m.so.6,cuda.so.1}; do
  check [ ! -e "$f" ] || fail "$(basename "$f") is in the bundle"
done
dangling=$(find "$B" -xtype l | head -3)
check [ -z "$dangling" ] || fail "links that point nowhere: $dangling"
# A bad bundle is refused before anything is written outside its folder.
printf 'not a bundle' >"$T/bad.tar.xz"
refute $PY "$root/tools/device/unpack.py" "$T/bad.tar.xz" "$T/bad" >/dev/null 2>&1 || fail "a bad file was unpacked"

begin "the normal run: deepseek-tiny, 2 ranks, 4 steps (reference)"
args=(-in input/deepseek-tiny.deck -var steps 4 -var log_every 1 -var eval_every 2 -var ckpt_every 2)
(cd "$root" && OMP_NUM_THREADS=1 timeout "$RUN_TIMEOUT" "$MPIEXEC" --oversubscribe -n 2 "$XX" "${args[@]}" \
  -var run_dir "$T/normal" >"$T/normal.out" 2>&1)
check [ $? -eq 0 ] || { fail "the normal run failed: $(tail -5 "$T/normal.out")"; finish; }

begin "the bundle in a namespace where Debian's MPI, HDF5, UCX, fmt and the rest are hidden: the same bits"
# Hidden: every file the bundle carries under root/ that exists here (its library closure, Open MPI's
# launcher and plugins), and whole the folders of Open MPI, PMIx, UCX and parallel HDF5.
(cd "$B/root" && find . -type f -o -type l) | sed 's|^\.||' >"$T/carried"
cat >"$T/hidden.sh" <<'EOF'
set -u
mount --make-rprivate /
empty_dir=$(mktemp -d) empty_file=$(mktemp)
# mount(8) itself loads some of the libraries the bundle carries (libpcre2-8, through libselinux): it
# binds with copies of its own, or hiding the first of them would stop every later bind.
mount_libs=$(mktemp -d)
for l in $(ldd "$(command -v mount)" | awk '$3 ~ /^\// {print $3}'); do cp -L "$l" "$mount_libs/"; done
bind() { LD_LIBRARY_PATH=$mount_libs mount --bind "$1" "$2"; }
hidden=0
for d in /usr/lib/x86_64-linux-gnu/openmpi /usr/lib/x86_64-linux-gnu/pmix2 /usr/lib/x86_64-linux-gnu/ucx \
  /usr/lib/x86_64-linux-gnu/hdf5 /usr/share/openmpi /etc/openmpi; do
  [ -d "$d" ] && bind "$empty_dir" "$d" && hidden=$((hidden + 1))
done
while read -r f; do
  [ -f "$f" ] && bind "$empty_file" "$f" 2>/dev/null && hidden=$((hidden + 1))
done <"$CARRIED"
for f in /usr/bin/orterun /usr/bin/mpirun /usr/bin/mpiexec /usr/bin/ompi_info; do
  [ -e "$f" ] && bind "$empty_file" "$f" 2>/dev/null
done
if [ -s /usr/lib/x86_64-linux-gnu/libpcre2-8.so.0 ]; then echo "libpcre2-8 still readable"; exit 3; fi
echo "hidden: $hidden files and folders"
# Nothing of Debian's MPI answers here.
if /usr/bin/mpirun --version >/dev/null 2>&1; then echo "Debian's mpirun still runs"; exit 3; fi
if [ -s /usr/lib/x86_64-linux-gnu/libfmt.so.9 ]; then echo "libfmt still readable"; exit 3; fi
source "$BUNDLE/env.sh"
cd "$BUNDLE"
# One rank without a launcher (a singleton starts the bundle's orted), then 2 through its orterun.
OMP_NUM_THREADS=1 xx_run bin/xuanxue -in input/deepseek-tiny.deck -var steps 1 -var run_dir "$SINGLETON" \
  >"$SINGLETON.out" 2>&1 || { echo "the singleton run failed:"; tail -5 "$SINGLETON.out"; exit 4; }
OMP_NUM_THREADS=1 xx_mpirun -n 2 bin/xuanxue "$@"
EOF
unshare -m env CARRIED="$T/carried" BUNDLE="$B" SINGLETON="$T/singleton" bash "$T/hidden.sh" "${args[@]}" -var run_dir "$T/bundled" \
  >"$T/bundled.out" 2>&1
rc=$?
grep -m1 '^hidden:' "$T/bundled.out" | sed 's/^/    /'
check [ $rc -eq 0 ] || { fail "the bundled run failed (exit $rc): $(grep -v '^ ' "$T/bundled.out" | tail -8)"; finish; }
check grep -q 'control *Open MPI v4' "$T/bundled.out" || fail "the bundled run does not report Open MPI"
check [ -s "$T/singleton/metrics.jsonl" ] || fail "the singleton run wrote no metrics"
curve "$T/normal/metrics.jsonl" "$T/normal.jsonl"
curve "$T/bundled/metrics.jsonl" "$T/bundled.jsonl"
check [ -s "$T/normal.jsonl" ] && check cmp -s "$T/normal.jsonl" "$T/bundled.jsonl" ||
  { fail "the bundled run's curve differs"; diff "$T/normal.jsonl" "$T/bundled.jsonl" | head -4 >&2; }
check [ -s "$T/bundled/ckpt/step_00000004.h5" ] || fail "the bundled run wrote no checkpoint (parallel HDF5)"

finish
