#!/usr/bin/env bash
# tools/lab/ablate's provenance, --order abba and --resume's refusal to mix
# binaries or corpora (docs/ABLATE.md), on one small real ablation:
# input/tiny.deck, 2 ranks, 2 variants, 2 seeds, 5 steps.
#   - every case records provenance: the binary's sha256 (that of XUANXUE), the
#     commit, library versions, the sha256 of the corpus its deck names,
#     network "none", CPU, the load before and after; its order_index;
#   - --order abba ran seed 1 as (a, b) and seed 2 as (b, a), by the clock too;
#   - --resume with another binary (a copy with one byte appended) exits 2
#     with one message naming both hashes, the source commits, a new --out and
#     --resume-any-binary, and writes nothing; --resume-any-binary then runs
#     the added seed and records the mix;
#   - --resume after the corpus changed exits 2 and names the file.
# usage: ablate_provenance.sh XUANXUE [MPIEXEC]
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT" || exit 1
ABLATE=(/usr/bin/python3 tools/lab/ablate --deck input/tiny.deck --ranks 2 --steps 5 --timeout 120
        --variant 'a: sync dense' --variant 'b: sync accumulate 2' --common 'checkpoint every 0 at_end no')

begin "a small ablation, --order abba"
LAST_CMD="${ABLATE[*]} --seeds 1,2 --order abba --bin $XX --out $T/ab"
"${ABLATE[@]}" --seeds 1,2 --order abba --bin "$XX" --out "$T/ab" >"$T/out" 2>"$T/err"
RC=$?
check [ "$RC" -eq 0 ] || { fail "exit status $RC, expected 0"; show_run; finish; }
report=$(/usr/bin/python3 - "$T/ab/results.json" "$XX" "$ROOT" <<'PY'
import hashlib, json, re, sys
doc, binary, root = json.load(open(sys.argv[1])), sys.argv[2], sys.argv[3]
sha = lambda p: hashlib.sha256(open(p, "rb").read()).hexdigest()
problems = []
cases = doc["cases"]
if len(cases) != 4:
    problems.append(f"{len(cases)} cases, expected 4")
for c in cases:
    p, who = c.get("provenance") or {}, f"{c['variant']} seed {c['seed']}"
    if p.get("binary", {}).get("sha256") != sha(binary):
        problems.append(f"{who}: binary sha256 {p.get('binary')} is not that of {binary}")
    if not re.fullmatch(r"[0-9a-f]{40}(\+changes)?", p.get("git", "")):
        problems.append(f"{who}: git {p.get('git')!r}")
    libs = p.get("libraries") or {}
    if not libs.get("openmpi") or not all(libs.values()):
        problems.append(f"{who}: libraries {libs}")
    data = p.get("data") or {}
    if data.get("sha256", {}).get("data/fortunes.txt") != sha(f"{root}/data/fortunes.txt") or not data.get("digest"):
        problems.append(f"{who}: data {data}")
    if p.get("network") != "none":
        problems.append(f"{who}: network {p.get('network')!r}, expected none")
    cpu = p.get("cpu") or {}
    if not cpu.get("model") or not cpu.get("cores"):
        problems.append(f"{who}: cpu {cpu}")
    for k in ("load_before", "load_after"):
        if not (isinstance(p.get(k), list) and len(p[k]) == 3):
            problems.append(f"{who}: {k} {p.get(k)}")
    if not p.get("backends", {}).get("control"):
        problems.append(f"{who}: no backends table from the console: {p.get('backends')}")
    if not isinstance(c.get("end_unix"), (int, float)):
        problems.append(f"{who}: end_unix {c.get('end_unix')}")
by_index = [(c["variant"], c["seed"]) for c in sorted(cases, key=lambda c: c["order_index"])]
by_clock = [(c["variant"], c["seed"]) for c in sorted(cases, key=lambda c: c["end_unix"])]
want = [("a", 1), ("b", 1), ("b", 2), ("a", 2)]
if by_index != want or by_clock != want:
    problems.append(f"order: by order_index {by_index}, by end time {by_clock}, expected {want}")
if doc["config"].get("order") != "abba":
    problems.append(f"config order {doc['config'].get('order')!r}")
print("\n".join(problems))
PY
)
check [ -z "$report" ] || fail "$report"
check grep -q "^provenance: binary sha256 [0-9a-f]\{12\}; source " "$T/ab/table.md" || fail "no provenance line in table.md"
check grep -q "order abba" "$T/ab/table.md" || fail "table.md does not name the order"

begin "--resume with another binary: exit 2, one message, nothing written"
cp "$XX" "$T/xx_other" && printf x >>"$T/xx_other"
old=$(sha256sum "$XX" | cut -c1-12)
new=$(sha256sum "$T/xx_other" | cut -c1-12)
snapshot "$T/ab" >"$T/before"
LAST_CMD="${ABLATE[*]} --seeds 1,2,3 --order abba --bin $T/xx_other --out $T/ab --resume"
"${ABLATE[@]}" --seeds 1,2,3 --order abba --bin "$T/xx_other" --out "$T/ab" --resume >"$T/out" 2>"$T/err"
RC=$?
check [ "$RC" -eq 2 ] || { fail "exit status $RC, expected 2"; show_run; }
check [ "$(wc -l <"$T/err")" -eq 1 ] || { fail "expected one line on stderr"; show_run; }
for want in "$old" "$new" "source tree" "new --out" "--resume-any-binary"; do
  check grep -qF -- "$want" "$T/err" || { fail "the message lacks '$want'"; show_run; }
done
snapshot "$T/ab" >"$T/after"
check cmp -s "$T/before" "$T/after" || fail "the refused --resume changed $T/ab: $(diff "$T/before" "$T/after" | head -5)"

begin "--resume-any-binary: the added seed runs with the other binary, the mix is recorded"
LAST_CMD="${ABLATE[*]} --seeds 1,2,3 --order abba --bin $T/xx_other --out $T/ab --resume --resume-any-binary"
"${ABLATE[@]}" --seeds 1,2,3 --order abba --bin "$T/xx_other" --out "$T/ab" --resume --resume-any-binary \
  >"$T/out" 2>"$T/err"
RC=$?
check [ "$RC" -eq 0 ] || { fail "exit status $RC, expected 0"; show_run; }
report=$(/usr/bin/python3 - "$T/ab/results.json" "$new" <<'PY'
import json, sys
doc, new = json.load(open(sys.argv[1])), sys.argv[2]
got = sorted((c["seed"], c["variant"], c["order_index"], c["provenance"]["binary"]["sha256"][:12] == new)
             for c in doc["cases"])
want = [(1, "a", 0, False), (1, "b", 1, False), (2, "a", 3, False), (2, "b", 2, False),
        (3, "a", 4, True), (3, "b", 5, True)]
print("" if got == want and len(doc["config"].get("mixed") or []) == 1 else f"cases {got}, mixed {doc['config'].get('mixed')}")
PY
)
check [ -z "$report" ] || fail "$report"
check grep -q "^MIXED (--resume-any-binary" "$T/ab/table.md" || fail "table.md does not show the mix"

begin "--resume after the corpus changed: exit 2, names the file"
head -c 400000 data/fortunes.txt >"$T/corpus.txt"
ONE=(/usr/bin/python3 tools/lab/ablate --deck input/tiny.deck --ranks 2 --steps 3 --timeout 120 --variant 'base:'
     --common 'checkpoint every 0 at_end no' --var data "$T/corpus.txt" --bin "$XX" --out "$T/ab2")
LAST_CMD="${ONE[*]} --seeds 1"
"${ONE[@]}" --seeds 1 >"$T/out" 2>"$T/err"
RC=$?
check [ "$RC" -eq 0 ] || { fail "exit status $RC, expected 0"; show_run; }
echo "one more fortune" >>"$T/corpus.txt"
snapshot "$T/ab2" >"$T/before"
LAST_CMD="${ONE[*]} --seeds 1,2 --resume"
"${ONE[@]}" --seeds 1,2 --resume >"$T/out" 2>"$T/err"
RC=$?
check [ "$RC" -eq 2 ] || { fail "exit status $RC, expected 2"; show_run; }
check grep -qF "corpus/tokenizer file $T/corpus.txt was sha256" "$T/err" || { fail "the message lacks the file"; show_run; }
snapshot "$T/ab2" >"$T/after"
check cmp -s "$T/before" "$T/after" || fail "the refused --resume changed $T/ab2"

finish
