#!/usr/bin/env bash
# tools/lab/verdicts --quick (issues 10/13, 15/18): every claim runs and is
# judged, at 2 seeds and a few steps, LR tuning and the network included, and
# a rerun resumes: it keeps every finished case and runs none again. The
# verdicts of so small a run mean nothing, but some rows hold at any scale,
# and are asserted: B2 (a rerun is bit-identical), B1 (a detached parameter is
# caught by grad_check and missed without it), B7 (a hung rank ends the job,
# named, with the watchdog; the job hangs without it), B3 (not testable here)
# and A4.2 (top-k 0.01 puts less than half of dense's bytes on the wire). The
# report rebuilt from its archive gives the same rows.
# usage: verdicts_quick.sh   (from anywhere; uses build/xuanxue of the repository)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out=$(mktemp -d "${TMPDIR:-/tmp}/xx-verdicts.XXXXXX")
trap 'rm -rf "$out"' EXIT
cd "$root"
source tools/env.sh

echo "--- first pass"
/usr/bin/python3 tools/lab/verdicts --quick --out "$out/v" | tail -40
first_cases=$(grep -c '^# case ' "$out/v/harness.txt")

echo "--- the results"
/usr/bin/python3 - "$out/v/results.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
fails = []
ids = [c["id"] for c in doc["claims"]]
if ids != ["A1", "A2", "A3", "A4", "A5", "A6", "A7", "B1", "B2", "B3", "B4", "B5", "B6", "B7"]:
    fails.append(f"claims {ids}")
allowed = {"confirmed", "confirmed, smaller than claimed", "refuted", "inconclusive", "not exercised",
           "metric cannot show it", "not testable here"}
rows = {r["row"]: r for c in doc["claims"] for r in c["rows"]}
for name, r in rows.items():
    if r["verdict"] not in allowed:
        fails.append(f"{name}: verdict {r['verdict']!r} ({r.get('effect_text')})")
    if r["n"] != (0 if r["verdict"] == "not testable here" else 2):
        fails.append(f"{name}: {r['n']} pairs (expected 2)")
primaries = [r["row"] for r in rows.values() if r["primary"]]
if len(primaries) != 14:
    fails.append(f"primary rows {primaries} (expected one per claim)")
for name, want in (("B2", "confirmed"), ("B1", "confirmed"), ("B7", "confirmed"), ("B3", "not testable here")):
    if rows[name]["verdict"] != want:
        fails.append(f"{name}: {rows[name]['verdict']} (expected {want}): {rows[name].get('pairs')}")
if not rows["A4.2"]["effect"]["mean"] < -0.5:
    fails.append(f"A4.2: top-k 0.01 wire bytes effect {rows['A4.2']['effect']} (expected below -50%)")
cases = [c for c in doc["provenance"]["binaries"]]
if len(cases) != 1:
    fails.append(f"binaries {cases} (expected exactly one)")
for f in fails:
    print("FAIL:", f)
print(f"{len(rows)} rows checked, {len(fails)} failures")
sys.exit(1 if fails else 0)
PY
grep -q '^| A1 ' "$out/v/VERDICTS.md" || { echo "FAIL: VERDICTS.md has no A1 row"; exit 1; }

echo "--- the report rebuilt from its archive"
/usr/bin/python3 tools/lab/verdicts --quick --from-archive "$out/v/verdicts/archive.json.xz" --out "$out/a" >/dev/null
/usr/bin/python3 - "$out/v/results.json" "$out/a/results.json" <<'PY'
import json, sys
rows = lambda p: [(r["row"], r["verdict"], r.get("effect_text")) for c in json.load(open(p))["claims"] for r in c["rows"]]
a, b = rows(sys.argv[1]), rows(sys.argv[2])
if a != b:
    print("FAIL: the archive's report differs:", [x for x in zip(a, b) if x[0] != x[1]])
    sys.exit(1)
print(f"the archive's report: the same {len(a)} rows")
PY

echo "--- a rerun keeps every finished case"
/usr/bin/python3 tools/lab/verdicts --quick --out "$out/v" >/dev/null
again=$(grep -c '^# case ' "$out/v/harness.txt")
if [ "$again" -ne "$first_cases" ]; then
  echo "FAIL: the rerun ran $((again - first_cases)) case(s) again (expected none)"
  exit 1
fi
echo "OK: $first_cases cases, none rerun"
