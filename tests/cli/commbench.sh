#!/usr/bin/env bash
# src/bin/commbench.cpp (xx_commbench) at 2 and 4 ranks, small sizes, sparse over
# MPI only (UCX may be built without):
#   - exit 0 and the footer "Out of bounds values : 0 OK";
#   - every table printed once: dense all-reduce, reduce-scatter, all-gather,
#     all-to-all, sparse; each with one row per size, #wrong 0 in every row,
#     the same rows as the --json file;
#   - the sizes and factors of nccl-tests: size = count * 4 for all-reduce,
#     count * R * 4 for the other three; busbw / algbw = 2(R-1)/R for
#     all-reduce and sparse, (R-1)/R for the other three;
#   - --cases picks tables (and JSON keys); an unknown case is bad usage (2).
# usage: commbench.sh XX_COMMBENCH [MPIEXEC]
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

SIZES=(-b 4K -e 64K -f 4 -w 1 -n 3)  # 3 rows per table: 4K, 16K, 64K

# check_tables NP CASES...: the last run's stdout and $T/out.json hold exactly
# the tables CASES, each as described above.
check_tables() {
  local np=$1 report
  shift
  report=$(/usr/bin/python3 - "$T/out" "$T/out.json" "$np" "$@" <<'PY'
import json, sys
out, doc_path, R, cases = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
titles = {"dense": "# dense all-reduce: MPI_Allreduce(MPI_SUM)",
          "reduce_scatter": "# reduce-scatter: MPI_Reduce_scatter_block(MPI_SUM)",
          "all_gather": "# all-gather: MPI_Allgather",
          "all_to_all": "# all-to-all: MPI_Alltoall",
          "sparse": "# sparse exchange over mpi"}
bus = {"dense": 2 * (R - 1) / R, "sparse": 2 * (R - 1) / R}
per_rank = {"reduce_scatter", "all_gather", "all_to_all"}
lines = open(out).read().splitlines()
doc = json.load(open(doc_path))
problems = []
for c, title in titles.items():
    starts = [i for i, l in enumerate(lines) if l.startswith(title)]
    if c not in cases:
        if starts or c in doc: problems.append(f"{c}: printed, but not asked for")
        continue
    if len(starts) != 1:
        problems.append(f"{c}: its title appears {len(starts)} times (expected once)")
        continue
    # The table's rows: the lines without '#' after its title, up to its average.
    rows = []
    for l in lines[starts[0] + 1:]:
        if l.startswith("# Avg bus bandwidth"): break
        if not l.startswith("#"): rows.append(l.split())
    expect_rows = 3 if c != "sparse" else 1
    if len(rows) != expect_rows: problems.append(f"{c}: {len(rows)} rows (expected {expect_rows})")
    bad = [r for r in rows if r[-1] != "0"]
    if bad: problems.append(f"{c}: #wrong not 0 in {bad}")
    js = doc.get(c, [])
    if len(js) != len(rows): problems.append(f"{c}: {len(js)} rows in the JSON, {len(rows)} printed")
    for r, j in zip(rows, js):
        if j["wrong"] != 0: problems.append(f"{c}: JSON wrong {j['wrong']}")
        if [int(r[0]), int(r[1])] != [j["size_bytes"], j["count"]]:
            problems.append(f"{c}: printed size, count {r[:2]} differ from the JSON's")
        if c == "sparse": continue
        size = j["count"] * 4 * (R if c in per_rank else 1)
        if j["size_bytes"] != size: problems.append(f"{c}: size {j['size_bytes']} for count {j['count']} (expected {size})")
        ratio = j["busbw_gbps"] / j["algbw_gbps"]
        if abs(ratio - bus.get(c, (R - 1) / R)) > 1e-9: problems.append(f"{c}: busbw / algbw = {ratio}")
    if c == "sparse": continue
    sizes = [j["size_bytes"] for j in js]
    want = [s // 4 // (R if c in per_rank else 1) * (R if c in per_rank else 1) * 4 for s in (4096, 16384, 65536)]
    if sizes != want: problems.append(f"{c}: sizes {sizes} (expected {want})")
if doc.get("wrong") != 0 or doc.get("ok") is not True: problems.append(f"JSON: wrong {doc.get('wrong')}, ok {doc.get('ok')}")
print("\n".join(problems))
PY
  )
  check [ -z "$report" ] || { fail "np $np: $report"; show_run; }
}

for np in 2 4; do
  begin "every table at $np ranks"
  rm -f "$T/out.json"
  run_xx "$np" "${SIZES[@]}" --sparse 16K --ratios 0.1 --quants int8 --transport mpi --json "$T/out.json"
  check [ "$RC" -eq 0 ] || { fail "np $np: exit code $RC (expected 0)"; show_run; }
  check grep -q -x -F '# Out of bounds values : 0 OK' "$T/out" || fail "np $np: no '0 OK' footer"
  check_tables "$np" dense reduce_scatter all_gather all_to_all sparse
done

begin "--cases picks the tables"
rm -f "$T/out.json"
run_xx 2 "${SIZES[@]}" --cases all_to_all,reduce_scatter --json "$T/out.json"
check [ "$RC" -eq 0 ] || { fail "exit code $RC (expected 0)"; show_run; }
check_tables 2 reduce_scatter all_to_all

begin "an unknown case"
expect_bad 2 "--cases 'all_reduce': expected one of dense, reduce_scatter, all_gather, all_to_all, sparse" \
  -- --cases dense,all_reduce

finish
