#!/usr/bin/env bash
# xuanxue -print-config json: every phase's resolved values as JSON (the deck
# reader of the Python tools, tools/xxpy/deck.py), for input/tiny.deck with
# -var, a two-phase deck, at 1 and 2 ranks; a bad deck is exit 2 with its
# one DECK:LINE message and nothing on stdout.
# usage: print_config.sh XUANXUE [MPIEXEC]
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

run() {  # run ARGS...: the binary alone (a singleton, as the Python tools run it)
  LAST_CMD="$XX $*"
  timeout "$RUN_TIMEOUT" "$XX" "$@" >"$T/out" 2>"$T/err"
  RC=$?
}

# assert PYTHON-EXPRESSION...: each true of j, the JSON on stdout
assert_json() {
  /usr/bin/python3 - "$T/out" "$@" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
bad = [e for e in sys.argv[2:] if not eval(e, {"j": j})]
for e in bad:
    print(f"not true: {e}", file=sys.stderr)
sys.exit(1 if bad else 0)
PY
}

begin "input/tiny.deck -var steps 20: one phase, the deck's values and the defaults"
cd "$ROOT" || exit 1
run -in input/tiny.deck -var steps 20 -var run_dir "$T/never" -print-config json
check [ $RC -eq 0 ] || { fail "exit code $RC (expected 0)"; show_run; }
check assert_json 'len(j["phases"]) == 1' 'j["phases"][0]["steps"] == 20' \
  'j["phases"][0]["where"].startswith("input/tiny.deck:")' \
  'j["phases"][0]["config"]["seed"] == 1234' \
  'j["phases"][0]["config"]["model"] == {"kind": "dense", "vocab": 256, "dim": 128, "layers": 4, "heads": 4, "ffn": 384, "seq": 128, "rope_theta": 10000.0, "norm_eps": 1e-05, "init_std": 0.02}' \
  'j["phases"][0]["config"]["attention"] == {"kind": "mha"}' \
  'j["phases"][0]["config"]["moe"]["mode"] == "off"' \
  'j["phases"][0]["config"]["data"]["format"] == "bytes" and j["phases"][0]["config"]["data"]["path"] == "data/fortunes.txt"' \
  'j["phases"][0]["config"]["data"]["tokenizer"] == ""' \
  'j["phases"][0]["config"]["optimizer"]["lr"] == 3e-3' \
  'j["phases"][0]["config"]["schedule"] == {"kind": "cosine", "warmup": 30, "min_lr": 3e-4, "total": 20}' \
  'j["phases"][0]["config"]["output"]["dir"] == "'"$T/never"'"' \
  'j["phases"][0]["config"]["output"]["tensorboard"] is True' \
  'j["phases"][0]["config"]["timeout"] == 600' || show_run
check [ ! -e "$T/never" ] || fail "-print-config created the run directory"
check [ ! -s "$T/err" ] || fail "stderr is not empty: $(cat "$T/err")"

begin "two phases, a data file that does not exist, at 2 ranks: one JSON document"
cat >"$T/two.deck" <<DECK
model dense vocab 256 dim 64 layers 2 heads 2 ffn 128 seq 32
data bytes $T/missing.txt batch 4
optimizer adamw lr 1e-3
run 5
optimizer adamw lr 5e-4
sync local 4
run 7
DECK
LAST_CMD="$MPIEXEC -n 2 $XX -in $T/two.deck -print-config json"
timeout "$RUN_TIMEOUT" "$MPIEXEC" -n 2 "$XX" -in "$T/two.deck" -print-config json >"$T/out" 2>"$T/err"
RC=$?
check [ $RC -eq 0 ] || { fail "exit code $RC (expected 0)"; show_run; }
check assert_json '[p["steps"] for p in j["phases"]] == [5, 7]' \
  '[p["where"] for p in j["phases"]] == ["'"$T"'/two.deck:4", "'"$T"'/two.deck:7"]' \
  '[p["config"]["optimizer"]["lr"] for p in j["phases"]] == [1e-3, 5e-4]' \
  '[p["config"]["sync"]["kind"] for p in j["phases"]] == ["dense", "local"]' \
  'all(p["config"]["schedule"]["total"] == 12 for p in j["phases"])' || show_run

begin "a bad deck: exit 2, its DECK:LINE message, nothing on stdout"
sed 's/^optimizer adamw lr 1e-3$/optimizer adamw lr fast/' "$T/two.deck" >"$T/bad.deck"
run -in "$T/bad.deck" -print-config json
check [ $RC -eq 2 ] || { fail "exit code $RC (expected 2)"; show_run; }
check grep -q "^$T/bad.deck:3: bad value 'fast' for 'lr'" "$T/err" || { fail "message"; show_run; }
check [ "$(wc -l <"$T/err")" -eq 1 ] || { fail "expected one line on stderr"; show_run; }
check [ ! -s "$T/out" ] || { fail "stdout is not empty"; show_run; }

begin "-print-config yaml: exit 2, the expected form named"
run -in "$T/two.deck" -print-config yaml
check [ $RC -eq 2 ] || { fail "exit code $RC (expected 2)"; show_run; }
check grep -q "bad value 'yaml' for -print-config (expected -print-config json)" "$T/err" || { fail "message"; show_run; }

finish
