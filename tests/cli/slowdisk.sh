#!/usr/bin/env bash
# tools/lab/slowdisk (docs/ABLATE.md): a real ablation of one small case
# (input/tiny.deck shrunk, 2 ranks, 1 seed, one checkpoint of about 5 MB at the
# end, --reload) on a file system throttled to 5 MB/s write, 10 MB/s read:
#   - the case passes; during the run every rank is in the cgroup and its
#     RUN_DIR/ckpt is a symlink into the loop-device mount (recorded by a --bin
#     wrapper that runs as each rank);
#   - the console's checkpoint write (MB / write s) and the reload's read are
#     within 2x of the limits (unthrottled, this disk writes over 100 MB/s);
#   - OUT/slowdisk.json holds the limits and a probe near them; the storage is in
#     config.storage and the case's provenance;
#   - --resume with other limits exits 2 and runs nothing; with the same limits
#     it keeps the finished case;
#   - SIGTERM during a case ends it, exit 130;
#   - after each command no mount, loop device, cgroup or image of it is left.
# Needs root and the cgroup v1 blkio controller; skipped (77) without them.
# usage: slowdisk.sh XUANXUE [MPIEXEC]
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT" || exit 1
if [ "$(id -u)" -ne 0 ] || [ ! -f /sys/fs/cgroup/blkio/blkio.throttle.write_bps_device ]; then
  echo "skipped: needs root and the cgroup v1 blkio controller"
  exit 77
fi

# The wrapper every rank runs: where it is (cgroup, the ckpt link and the mount under it), then xuanxue.
# tools/lab/ablate also runs it to read the deck (-print-config json): not a rank, not recorded.
cat >"$T/xx-wrap" <<EOF
#!/bin/bash
run_dir=
args=("\$@")
for ((i = 0; i + 2 < \${#args[@]}; ++i)); do
  [ "\${args[i]}" = -var ] && [ "\${args[i+1]}" = run_dir ] && run_dir=\${args[i+2]}
done
if [ -n "\$run_dir" ] && [[ " \$* " != *" -dry-run "* && " \$* " != *" -print-config "* ]]; then  # runs only
  link=\$(readlink "\$run_dir/ckpt")
  echo "\$(grep -m1 blkio /proc/self/cgroup) | \$link | \$(findmnt -n -o SOURCE,TARGET -T "\$link")" >>"$T/ranks.txt"
fi
exec "$XX" "\$@"
EOF
chmod +x "$T/xx-wrap"

SD=(/usr/bin/python3 tools/lab/slowdisk --write-mbps 5 --read-mbps 10 --size-gb 0.5 --dir "$T")
ABL=(--deck input/tiny.deck --ranks 2 --seeds 1 --timeout 120 --bin "$T/xx-wrap" --reload
     --variant 'small: model dense vocab 256 dim 64 layers 2 heads 4 ffn 192 seq 64'
     --common 'checkpoint every 0 at_end yes; eval every 0 batches 1')

leftovers() {  # leftovers SLOWDISK_JSON: what of that run is still there (empty: nothing)
  /usr/bin/python3 - "$1" <<'PY'
import json, os, sys
d = json.load(open(sys.argv[1]))
dev = d["device"].split()[0]
left = [l.split()[1] for l in open("/proc/mounts") if "xxslowdisk" in l and d["mount"] in l]
left += [p for p in (d["cgroup"], d["image"], os.path.dirname(d["image"])) if os.path.exists(p)]
if os.popen(f"losetup -a | grep -F {os.path.dirname(d['image'])}").read().strip():
    left.append(dev)
print(" ".join(left))
PY
}

begin "one case on a disk throttled to 5 MB/s"
LAST_CMD="${SD[*]} -- ${ABL[*]} --steps 3 --out $T/sd"
"${SD[@]}" -- "${ABL[@]}" --steps 3 --out "$T/sd" >"$T/out" 2>"$T/err"
RC=$?
check [ "$RC" -eq 0 ] || { fail "exit status $RC, expected 0"; show_run; finish; }
report=$(/usr/bin/python3 - "$T/sd" "$T/ranks.txt" <<'PY'
import json, os, re, sys
out, ranks = sys.argv[1], sys.argv[2]
problems = []
sd = json.load(open(os.path.join(out, "slowdisk.json")))
if sd.get("write_mbps") != 5 or sd.get("read_mbps") != 10:
    problems.append(f"slowdisk.json limits {sd.get('write_mbps')}, {sd.get('read_mbps')}")
p = sd.get("probe") or {}
if not (2.5 <= p.get("write_mbps", 0) <= 10 and 5 <= p.get("read_mbps", 0) <= 20):
    problems.append(f"probe {p} not within 2x of 5 and 10 MB/s")
doc = json.load(open(os.path.join(out, "results.json")))
st = doc["config"].get("storage") or {}
if st.get("write_mbps") != 5 or st.get("read_mbps") != 10:
    problems.append(f"config.storage {st}")
c = doc["cases"][0]
if (c.get("provenance") or {}).get("storage") != st:
    problems.append(f"provenance.storage {(c.get('provenance') or {}).get('storage')}")
lines = open(ranks).read().splitlines()
if len(lines) != 4:  # 2 ranks, the run and the reload
    problems.append(f"{len(lines)} rank records, expected 4: {lines}")
for l in lines:
    cg, link, mnt = (x.strip() for x in l.split("|"))
    if not cg.endswith(sd["cgroup"].split("/blkio", 1)[1]):
        problems.append(f"a rank ran in cgroup {cg!r}, expected {sd['cgroup']}")
    if not link.startswith(sd["mount"] + "/"):
        problems.append(f"its ckpt link -> {link!r}, expected into {sd['mount']}")
    if not mnt.startswith(sd["device"].split()[0]):
        problems.append(f"its ckpt is on {mnt!r}, expected {sd['device']}")
con = open(os.path.join(out, c["dir"], "console.txt")).read()
m = re.search(r"^checkpoint \S+ \(.*?, ([0-9.]+) MB, write ([0-9.]+) s", con, re.M)
if not m:
    problems.append("no checkpoint line in console.txt")
else:
    mb, s = float(m.group(1)), float(m.group(2))
    if not (2.5 <= mb / s <= 10) or mb < 2:
        problems.append(f"checkpoint {mb} MB in {s} s = {mb / s:.2f} MB/s, expected within 2x of 5")
    rel = open(os.path.join(out, c["dir"], "console_reload.txt")).read()
    r = re.search(r"^resumed from \S+ at step 3 \(read and broadcast in ([0-9.]+) s\)", rel, re.M)
    if not r:
        problems.append("no 'resumed from ... at step 3' in console_reload.txt")
    elif mb / float(r.group(1)) > 20:
        problems.append(f"reload read {mb} MB in {r.group(1)} s: faster than 2x the 10 MB/s limit")
print("\n".join(problems))
PY
)
check [ -z "$report" ] || { fail "$report"; show_run; }
left=$(leftovers "$T/sd/slowdisk.json")
check [ -z "$left" ] || fail "left behind: $left"

begin "--resume: other limits refused, the same kept"
SD2=(/usr/bin/python3 tools/lab/slowdisk --write-mbps 6 --read-mbps 10 --size-gb 0.5 --dir "$T")
LAST_CMD="${SD2[*]} -- ${ABL[*]} --steps 3 --out $T/sd --resume"
"${SD2[@]}" -- "${ABL[@]}" --steps 3 --out "$T/sd" --resume >"$T/out" 2>"$T/err"
RC=$?
check [ "$RC" -eq 2 ] || { fail "exit status $RC, expected 2"; show_run; }
check grep -q "limits" "$T/err" || { fail "no word of the limits in stderr"; show_run; }
check [ -z "$(ls "$T" | grep xxslowdisk)" ] || fail "a refused resume left $(ls "$T" | grep xxslowdisk)"
LAST_CMD="${SD[*]} -- ${ABL[*]} --steps 3 --out $T/sd --resume"
"${SD[@]}" -- "${ABL[@]}" --steps 3 --out "$T/sd" --resume >"$T/out" 2>"$T/err"
RC=$?
check [ "$RC" -eq 0 ] || { fail "exit status $RC, expected 0"; show_run; }
check grep -q "1 finished before, kept" "$T/out" || { fail "the finished case was not kept"; show_run; }
left=$(leftovers "$T/sd/slowdisk.json")
check [ -z "$left" ] || fail "left behind: $left"

begin "SIGTERM during a case: exit 130, nothing left"
LAST_CMD="${SD[*]} -- ${ABL[*]} --steps 2000 --out $T/term"
note_mount() { mnt=$(ls -d "$T"/xxslowdisk*/mnt 2>/dev/null); }
term_mid_case "$T/term/small/seed1/console.txt" note_mount "${SD[@]}" -- "${ABL[@]}" --steps 2000 --out "$T/term"
pid=$PID
check [ -n "$mnt" ] || fail "no mount seen during the run"
check [ -z "$(ls "$T" | grep xxslowdisk)" ] || fail "left behind in $T: $(ls "$T" | grep xxslowdisk)"
check [ -z "$(grep -F "$T/xxslowdisk" /proc/mounts)" ] || fail "a mount is left: $(grep -F "$T/xxslowdisk" /proc/mounts)"
check [ -z "$(losetup -a | grep -F "$T/xxslowdisk")" ] || fail "a loop device is left: $(losetup -a | grep -F "$T/")"
check [ -z "$(ls -d /sys/fs/cgroup/blkio/xxslowdisk"$pid" 2>/dev/null)" ] || fail "cgroup xxslowdisk$pid is left"

finish
