#!/usr/bin/env bash
# tools/verdicts --quick (issue 10/13): every claim runs and is judged, at 2
# seeds and a few steps, and a rerun resumes: it keeps every finished case
# and runs none again. The verdicts of so small a run mean nothing, but three
# rows hold at any scale, and are asserted: B2 (a rerun is bit-identical),
# B1.2 (a detached parameter is caught by grad_check and missed without it)
# and A4 (top-k 0.1 sends less than dense).
# usage: verdicts_quick.sh   (from anywhere; uses build/xuanxue of the repository)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out=$(mktemp -d "${TMPDIR:-/tmp}/xx-verdicts.XXXXXX")
trap 'rm -rf "$out"' EXIT
cd "$root"
source tools/env.sh

echo "--- first pass"
/usr/bin/python3 tools/verdicts --quick --out "$out/v" | tail -40
first_cases=$(grep -c '^# case ' "$out/v/harness.txt")

echo "--- the results"
/usr/bin/python3 - "$out/v/results.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
fails = []
ids = [c["id"] for c in doc["claims"]]
if ids != ["A1", "A2", "A3", "A4", "A5", "A6", "A7", "B1", "B2", "B3", "B4", "B5", "B6", "B7"]:
    fails.append(f"claims {ids}")
allowed = {"confirmed", "confirmed, smaller than claimed", "refuted", "inconclusive"}
rows = {r["row"]: r for c in doc["claims"] for r in c["rows"]}
for name, r in rows.items():
    if r["verdict"] not in allowed:
        fails.append(f"{name}: verdict {r['verdict']!r} ({r.get('effect_text')})")
    if r["n"] != 2:
        fails.append(f"{name}: {r['n']} pairs (expected 2)")
if rows["B2"]["verdict"] != "confirmed":
    fails.append(f"B2: reruns not bit-identical: {rows['B2']['pairs']}")
if rows["B1.2"]["verdict"] != "confirmed":
    fails.append(f"B1.2: detach not caught, or caught without the check: {rows['B1.2']['pairs']}")
if not rows["A4"]["effect"]["hi"] < -0.5:
    fails.append(f"A4: top-k 0.1 bytes effect {rows['A4']['effect']} (expected below -50%)")
for f in fails:
    print("FAIL:", f)
print(f"{len(rows)} rows checked, {len(fails)} failures")
sys.exit(1 if fails else 0)
PY
grep -q '^| A1 ' "$out/v/VERDICTS.md" || { echo "FAIL: VERDICTS.md has no A1 row"; exit 1; }

echo "--- a rerun keeps every finished case"
/usr/bin/python3 tools/verdicts --quick --out "$out/v" >/dev/null
again=$(grep -c '^# case ' "$out/v/harness.txt")
if [ "$again" -ne "$first_cases" ]; then
  echo "FAIL: the rerun ran $((again - first_cases)) case(s) again (expected none)"
  exit 1
fi
echo "OK: $first_cases cases, none rerun"
