#!/usr/bin/env bash
# tools/lab/netsim --nodes (docs/ABLATE.md): a two-level network of 2 "nodes"
# (network namespaces on a bridge, each node's uplink shaped to 20 Mbit/s) and
# one small case on it (input/tiny.deck, 4 ranks, 3 steps, sync dense):
#   - the probes: a TCP transfer from node 0 to node 1 within 2x of 20 Mbit/s,
#     one inside node 0 at least 5x faster; OUT/netsim.json has the layout
#     (ranks 0 1 | 2 3) and config.network and the case's provenance record it;
#   - the case exits 0 with every rank in its node's namespace, node-major
#     (recorded by a --bin wrapper that runs as each rank);
#   - its losses equal those of the same case without netsim (MPI's default
#     transports; the reduction order is the same), or, should the order
#     depend on the transport, agree within 1e-5 relative (said in the output);
#   - its ms_per_step is at least twice that of the case without netsim;
#   - --resume with another K or rate exits 2 before making anything; with the
#     same network it keeps the finished case;
#   - SIGTERM during a case ends it, exit 130;
#   - after each command no namespace, bridge or veth of it is left.
# Needs root, ip and tc (iproute2) and bridges; skipped (77) without them.
# usage: netsim_nodes.sh XUANXUE [MPIEXEC]
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT" || exit 1
export PATH="$PATH:/usr/sbin:/sbin"
if [ "$(id -u)" -ne 0 ] || ! command -v ip >/dev/null || ! command -v tc >/dev/null; then
  echo "skipped: needs root, ip and tc (iproute2)"
  exit 77
fi
if ! ip link add "xxnbtest$$" type bridge 2>/dev/null; then
  echo "skipped: cannot make a bridge here"
  exit 77
fi
ip link del "xxnbtest$$"

# The wrapper every rank runs: its rank and namespace, then xuanxue (the dry run, outside mpirun: just xuanxue).
cat >"$T/xx-wrap" <<EOF
#!/bin/bash
if [ -n "\${OMPI_COMM_WORLD_RANK:-}" ]; then
  echo "\$OMPI_COMM_WORLD_RANK \$(ip netns identify \$\$)" >>"$T/ranks.txt"
fi
exec "$XX" "\$@"
EOF
chmod +x "$T/xx-wrap"

NS=(/usr/bin/python3 tools/lab/netsim --nodes 2 --rate 20mbit)
ABL=(--deck input/tiny.deck --ranks 4 --seeds 1 --timeout 240 --bin "$T/xx-wrap"
     --variant 'dense: sync dense' --common 'checkpoint every 0 at_end no; eval every 0 batches 1')

leftovers() {  # leftovers PID: the namespaces, bridge and veths of the tools/lab/netsim of that pid still there
  { ip netns list | grep -o "xxnetsim${1}n[0-9]*"; ip -o link show | grep -o -E "xxnb${1}\b|xxn${1}v[0-9]+"; } | tr '\n' ' '
}

begin "4 ranks on 2 nodes at 20mbit"
LAST_CMD="${NS[*]} -- ${ABL[*]} --steps 3 --out $T/ns"
"${NS[@]}" -- "${ABL[@]}" --steps 3 --out "$T/ns" >"$T/out" 2>"$T/err"
RC=$?
check [ "$RC" -eq 0 ] || { fail "exit status $RC, expected 0"; show_run; finish; }
report=$(/usr/bin/python3 - "$T/ns" "$T/ranks.txt" <<'PY'
import json, os, sys
out, ranks = sys.argv[1], sys.argv[2]
problems = []
ns = json.load(open(os.path.join(out, "netsim.json")))
rate = 20e6 / 8
p = ns.get("probes") or {}
inter, intra = (p.get(k, {}).get("bytes_per_s", 0) for k in ("inter", "intra"))
print(f"# probes: inter-node {8 * inter / 1e6:.1f} Mbit/s (asked 20), intra-node {8 * intra / 1e6:.0f} Mbit/s")
if not rate / 2 <= inter <= 2 * rate:
    problems.append(f"inter-node probe {8 * inter / 1e6:.1f} Mbit/s, expected within 2x of 20")
if intra < 5 * inter:
    problems.append(f"intra-node probe {8 * intra / 1e6:.1f} Mbit/s, expected at least 5x the inter-node one")
if ns.get("nodes") != 2 or ns.get("layout") != [[0, 1], [2, 3]]:
    problems.append(f"netsim.json nodes {ns.get('nodes')}, layout {ns.get('layout')}")
doc = json.load(open(os.path.join(out, "results.json")))
net = doc["config"].get("network") or {}
if net.get("nodes") != 2 or net.get("layout") != [[0, 1], [2, 3]] or net.get("rate") != "20mbit":
    problems.append(f"config.network {net}")
c = doc["cases"][0]
if (c.get("provenance") or {}).get("network") != net:
    problems.append(f"provenance.network {(c.get('provenance') or {}).get('network')}")
where = dict(l.split(maxsplit=1) for l in open(ranks).read().splitlines() if len(l.split()) == 2)
want = {str(r): ns["node"][r // 2]["namespace"] for r in range(4)}
if where != want:
    problems.append(f"ranks ran in {where}, expected {want}")
print("\n".join(problems))
PY
)
problems=$(grep -v '^# probes' <<<"$report")
grep '^# probes' <<<"$report"
check [ -z "$problems" ] || { fail "$problems"; show_run; }
pid=$(/usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["bridge"][4:])' "$T/ns/netsim.json")
left=$(leftovers "$pid")
check [ -z "$left" ] || fail "left behind: $left"

begin "the same case without netsim: the same losses, faster steps"
LAST_CMD="tools/lab/ablate ${ABL[*]} --steps 3 --out $T/plain"
/usr/bin/python3 tools/lab/ablate "${ABL[@]}" --steps 3 --out "$T/plain" >"$T/out" 2>"$T/err"
RC=$?
check [ "$RC" -eq 0 ] || { fail "exit status $RC, expected 0"; show_run; finish; }
report=$(/usr/bin/python3 - "$T/ns/dense/seed1/metrics.jsonl" "$T/plain/dense/seed1/metrics.jsonl" <<'PY'
import json, sys
a, b = ([json.loads(l) for l in open(p)] for p in sys.argv[1:3])
loss = lambda recs: [(r["step"], r["loss"]) for r in recs if "loss" in r]
ms = lambda recs: sum(r["ms_per_step"] for r in recs if "ms_per_step" in r) / max(1, sum("ms_per_step" in r for r in recs))
la, lb = loss(a), loss(b)
problems = []
if [s for s, _ in la] != [s for s, _ in lb] or not la:
    problems.append(f"steps differ: {[s for s, _ in la]} against {[s for s, _ in lb]}")
elif la == lb:
    print(f"# losses identical with and without netsim ({len(la)} steps, last {la[-1][1]})")
else:
    worst = max(abs(x - y) / abs(y) for (_, x), (_, y) in zip(la, lb))
    print(f"# losses differ with and without netsim, by up to {worst:.2e} relative: the reduction order "
          "of MPI's all-reduce depends on the transport (tcp here, shared memory there)")
    if worst > 1e-5:
        problems.append(f"losses differ by {worst:.2e} relative (more than 1e-5): {la} against {lb}")
ma, mb = ms(a), ms(b)
print(f"# ms_per_step: {ma:.0f} on 2 nodes at 20mbit, {mb:.0f} without netsim")
if not ma >= 2 * mb:
    problems.append(f"ms_per_step {ma:.0f} under netsim, expected at least twice {mb:.0f} without it")
print("\n".join(problems))
PY
)
grep '^# ' <<<"$report"
problems=$(grep -v '^# ' <<<"$report")
check [ -z "$problems" ] || { fail "$problems"; show_run; }

begin "--resume: another K or rate refused, the same kept"
for other in "--nodes 4 --rate 20mbit" "--nodes 2 --rate 30mbit"; do
  LAST_CMD="tools/lab/netsim $other -- ${ABL[*]} --steps 3 --out $T/ns --resume"
  # shellcheck disable=SC2086
  /usr/bin/python3 tools/lab/netsim $other -- "${ABL[@]}" --steps 3 --out "$T/ns" --resume >"$T/out" 2>"$T/err"
  RC=$?
  check [ "$RC" -eq 2 ] || { fail "$other: exit status $RC, expected 2"; show_run; }
  check grep -q "expected the same network" "$T/err" || { fail "$other: no word of the network"; show_run; }
done
check [ -z "$(ip netns list | grep xxnetsim)$(ip -o link show | grep -o -E 'xxnb[0-9]+')" ] ||
  fail "a refused resume left $(ip netns list | grep xxnetsim) $(ip -o link show | grep -o -E 'xxnb[0-9]+')"
LAST_CMD="${NS[*]} -- ${ABL[*]} --steps 3 --out $T/ns --resume"
"${NS[@]}" -- "${ABL[@]}" --steps 3 --out "$T/ns" --resume >"$T/out" 2>"$T/err"
RC=$?
check [ "$RC" -eq 0 ] || { fail "exit status $RC, expected 0"; show_run; }
check grep -q "1 finished before, kept" "$T/out" || { fail "the finished case was not kept"; show_run; }
pid=$(/usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["bridge"][4:])' "$T/ns/netsim.json")
left=$(leftovers "$pid")
check [ -z "$left" ] || fail "left behind: $left"

begin "SIGTERM during a case: exit 130, nothing left"
LAST_CMD="${NS[*]} -- ${ABL[*]} --steps 2000 --out $T/term"
note_leftovers() { seen=$(leftovers "$PID"); }
term_mid_case "$T/term/dense/seed1/console.txt" note_leftovers "${NS[@]}" -- "${ABL[@]}" --steps 2000 --out "$T/term"
pid=$PID
check [ -n "$seen" ] || fail "no namespace or bridge seen during the run"
left=$(leftovers "$pid")
check [ -z "$left" ] || fail "left behind: $left"

finish
