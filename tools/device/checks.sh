#!/usr/bin/env bash
# The GPU checks, run from an unpacked tools/device-bundle on a machine with an NVIDIA GPU and
# none of our dependencies (docs/GPU.md): no build, no install. At most 8 minutes in all: every
# stage says when it starts and has its own time limit, cut to what is left of the whole; a failing
# stage does not stop the later ones.
#   facts     OS, glibc, driver, GPU, clocks; where cuBLAS and NCCL were found; ldd, nothing missing
#   smoke     2 steps of deepseek-tiny
#   parity    deepseek-tiny fp32, 50 steps at lr 3e-4 (packed attention, the CPU's kernel): twice,
#             bit-identical, and within 1e-4 relative of the CPU build's losses (tests/gpu/)
#   flash     the same with attention auto (flash on a GPU): within 1e-4 relative of packed's
#   speed     input/deepseek-gpu.deck in bf16 and in fp32 as TF32; input/dense-probe.deck
#             (1.62 B parameters, bf16): tokens/s, and MFU against the measured bf16 peak and the datasheet's
#   ranks     2 ranks on the one GPU over MPI (auto passes NCCL over, saying why), shard optimizer too,
#             against the CPU build's 2-rank losses
#   hf        a DeepSeek-V3-shaped run exported (tools/ckpt export --format hf), loaded by this
#             machine's transformers (AutoModelForCausalLM): its logits against ours (1e-4)
#   hf_import transformers' own DeepseekV3ForCausalLM and tokenizer (save_pretrained), imported by
#             init hf: the same token ids on a multilingual prompt and the same logits (1e-4)
#   unit      the unit tests that run kernels, GEMMs and the decoder on the GPU
#   (speed_tf32, the TF32 half of speed, comes here: the stages that decide a goal go first)
#   sanitize  compute-sanitizer memcheck on one step, if time is left
# Output: everything printed also goes to OUT/checks.txt; the stage logs to OUT/logs.tar.gz.
# Exit 0 when every stage passed, 1 otherwise.
#   bash XX/tools/device/checks.sh [OUT]        (XX: the unpacked bundle)
# Environment: XX_CHECKS_ONLY="STAGE ..." runs those alone (facts always); XX_CHECKS_SECONDS (470) the
# whole; XX_GPU_LIBS_FIRST=1 loads the machine's CUDA libraries before the bundle's (env.sh).
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/../../env.sh"
cd "$XX_BUNDLE"
out="${1:-${OUT:-/tmp/xx-checks}}"
mkdir -p "$out"
logs="$(mktemp -d /tmp/xx-logs.XXXXXX)"
exec > >(tee "$out/checks.txt") 2>&1
deadline=$((SECONDS + ${XX_CHECKS_SECONDS:-470}))
export PATH="$PATH:/usr/local/cuda/bin"  # compute-sanitizer, cuda-gdb
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 PYTHONUNBUFFERED=1
# This VM's MPI: shared memory between ranks, no single-copy kernel module, no network fabric.
export OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
PY="${PYTHON:-python3}"
export XX_LIBS
export -f xx_run xx_mpirun
# limited PROGRAM ARGS...: within the stage's limit. A crash (SIGSEGV, SIGABRT) is run again under
# cuda-gdb, time allowing, and its backtrace printed: the bundle's programs keep their symbol tables.
limited() {
  timeout "$LIMIT" bash -c 'xx_run "$@"' xx "$@"
  local rc=$?
  if { [ $rc -eq 139 ] || [ $rc -eq 134 ]; } && command -v cuda-gdb >/dev/null && [ $((deadline - SECONDS)) -gt 60 ]; then
    echo "# exit $rc: the backtrace, from cuda-gdb:"
    UCX_HANDLE_ERRORS=none timeout 50 bash -c 'xx_run cuda-gdb -batch -ex "set pagination off" -ex run -ex bt \
      -ex "x/2gx \$sp" -ex "info symbol *(void**)\$sp" --args "$@"' xx "$@" 2>&1 |
      grep -E '^(#[0-9]|Thread|0x|Program)' | cut -c1-400 | head -24 | sed 's/^/    gdb| /'
  fi
  return $rc
}
limited_np() { local n=$1; shift; timeout "$LIMIT" bash -c 'xx_mpirun -n "$@"' xx "$n" "$@"; }  # limited_np N ...
XX="$XX_BUNDLE/bin/xuanxue"
failed=()

stage() {  # stage NAME CAP_SECONDS: prints its start; sets LIMIT (0: no time left, skip)
  STAGE=$1
  if [ -n "${XX_CHECKS_ONLY:-}" ] && [ "$STAGE" != facts ] && [[ " $XX_CHECKS_ONLY " != *" $STAGE "* ]]; then
    echo "=== $STAGE: not asked (XX_CHECKS_ONLY=$XX_CHECKS_ONLY)"
    LIMIT=0
    return 1
  fi
  local left=$((deadline - SECONDS))
  LIMIT=$(($2 < left ? $2 : left))
  if [ "$LIMIT" -lt 10 ]; then
    echo "=== $STAGE: SKIPPED (${left} s left of the whole)"
    LIMIT=0
    return 1
  fi
  echo "=== $STAGE (at ${SECONDS} s, limit ${LIMIT} s)"
}
verdict() {  # verdict RC DETAIL
  if [ "$1" -eq 0 ]; then echo "PASS  $STAGE: $2"; else echo "FAIL  $STAGE: $2"; failed+=("$STAGE"); fi
}
losses() { "$PY" "$here/losses.py" curve "$1"; }      # losses RUN_DIR: "step loss" per line, 17 digits
follows() { "$PY" "$here/losses.py" follows "$@"; }  # follows REFERENCE RUN WHAT-REF WHAT-RUN: within 1e-4
tiny() {  # tiny NAME ATTENTION [RANKS] [ARGS...]: deepseek-tiny fp32 at lr 3e-4, a record every step
  local name=$1 attention=$2 ranks=${3:-1}
  shift 3 2>/dev/null || shift $#
  local cmd=("$XX" -in input/deepseek-tiny.deck -var steps 50 -var lr 3e-4 -var log_every 1 -var eval_every 0
    -var ckpt_every 0 -var attention_kernel "$attention" -var run_dir "$logs/$name" "$@")
  if [ "$ranks" -gt 1 ]; then limited_np "$ranks" "${cmd[@]}" >"$logs/$name.log" 2>&1
  else limited "${cmd[@]}" >"$logs/$name.log" 2>&1; fi
}
show_tail() { tail -n "${2:-15}" "$1" | sed 's/^/    | /'; }

echo "# tools/device/checks.sh from the bundle at $XX_BUNDLE ($XX_BUNDLE_KIND), $(date -u '+%F %T UTC')"
grep -m1 '^# commit' MANIFEST 2>/dev/null

# ---------------------------------------------------------------------------------------------
stage facts 40
echo "os: $(. /etc/os-release 2>/dev/null; echo "${PRETTY_NAME:-?}"); kernel $(uname -r); $(nproc) cores"
echo "cpu: $(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
echo "glibc: $(ldd --version 2>&1 | head -1)"
echo "python: $("$PY" -c 'import sys; print(sys.version.split()[0], sys.executable)' 2>&1)"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit \
  --format=csv 2>&1 | sed 's/^/gpu: /'
# cuBLAS and NCCL: the Python wheels (nvidia-cublas, nvidia-nccl-cu13), else the CUDA toolkit's.
XX_GPU_LIBS=$("$PY" - <<'PY'
import glob, os, site, sys
roots = site.getsitepackages() + [site.getusersitepackages()] + ["/usr/local/cuda/lib64", "/usr/local/cuda/lib"]
found = {}
import ctypes.util
if not ctypes.util.find_library("cuda"):  # the driver's libcuda.so.1 outside the loader's cache
    roots = ["/usr/local/nvidia/lib64", "/usr/local/nvidia/lib", "/usr/lib/x86_64-linux-gnu", "/usr/lib64"] + roots
for want in ("libcublas.so.13", "libcublasLt.so.13", "libnccl.so.2") + (() if ctypes.util.find_library("cuda") else ("libcuda.so.1",)):
    for r in roots:
        hits = sorted(glob.glob(os.path.join(r, "**", want), recursive=True)) if os.path.isdir(r) else []
        if hits:
            found[want] = os.path.dirname(hits[0]); break
for k, v in found.items():
    print(f"{k}: {v}", file=sys.stderr)
print(":".join(dict.fromkeys(found.values())))
PY
)
export XX_GPU_LIBS
echo "XX_GPU_LIBS=$XX_GPU_LIBS${XX_GPU_LIBS_FIRST:+ (first: XX_GPU_LIBS_FIRST)}"
for d in ${XX_GPU_LIBS//:/ }; do echo "  $d: $(ls "$d" | tr '\n' ' ' | cut -c1-300)"; done
# This card's bf16 ceiling, measured now (torch, 8192^3 on random data, the median of 20 after 5 warm-ups).
timeout 40 "$PY" - <<'PY' 2>&1 | sed 's/^/peak: /'
import torch
a, b = (torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16) for _ in range(2))
times = []
for i in range(25):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record(); a @ b; e.record(); torch.cuda.synchronize()
    if i >= 5: times.append(s.elapsed_time(e))
ms = sorted(times)[len(times) // 2]
print(f"bf16 8192^3 matmul through torch {torch.__version__}: {2 * 8192**3 / ms / 1e9:.0f} TFLOP/s (median of 20, {ms:.3f} ms)")
PY
missing=$(for f in bin/xuanxue bin/unit_tests bin/mpi_tests root/usr/bin/orterun; do
  LD_LIBRARY_PATH="$XX_LIBS:$XX_GPU_LIBS" ldd "$f" | grep 'not found' | sed "s|^|$f: |"; done)
if [ -z "$missing" ]; then verdict 0 "ldd: every library of xuanxue, unit_tests, mpi_tests and orterun found"
else echo "$missing"; verdict 1 "ldd: libraries missing"; fi
LD_LIBRARY_PATH="$XX_LIBS:$XX_GPU_LIBS" ldd bin/xuanxue | grep -E 'cublas|nccl|cudart|libcuda|libstdc' | sed 's/^/    /'

# ---------------------------------------------------------------------------------------------
if stage smoke 60; then
  t0=$SECONDS
  limited "$XX" -in input/deepseek-tiny.deck -var steps 2 -var log_every 1 -var eval_every 0 -var ckpt_every 0 \
    -var run_dir "$logs/smoke" >"$logs/smoke.log" 2>&1
  rc=$?
  sed -n '/^# backends/,/^$/p' "$logs/smoke.log" | sed 's/^/    /'
  [ $rc -eq 0 ] || show_tail "$logs/smoke.log"
  verdict $rc "2 steps of deepseek-tiny (exit $rc, $((SECONDS - t0)) s)"
fi

# ---------------------------------------------------------------------------------------------
# ---------------------------------------------------------------------------------------------
if stage parity 90; then
  t0=$SECONDS
  tiny tiny_a packed; rc_a=$?
  tiny tiny_b packed; rc_b=$?
  if [ $rc_a -ne 0 ] || [ $rc_b -ne 0 ]; then
    show_tail "$logs/tiny_a.log"
    verdict 1 "deepseek-tiny failed (exit $rc_a, $rc_b)"
  else
    losses "$logs/tiny_a" >"$logs/tiny_a.txt"
    losses "$logs/tiny_b" >"$logs/tiny_b.txt"
    cmp -s "$logs/tiny_a.txt" "$logs/tiny_b.txt"
    verdict $? "reruns bit-identical: $(wc -l <"$logs/tiny_a.txt") steps of deepseek-tiny, twice ($((SECONDS - t0)) s)"
    v=$(follows tests/gpu/deepseek-tiny-cpu.txt "$logs/tiny_a.txt" CPU GPU)
    verdict $? "against the CPU build: $v"
    grep '^PERFORMANCE' "$logs/tiny_a.log" | sed 's/^/    /'
  fi
fi

if stage flash 60; then
  tiny tiny_flash auto
  rc=$?
  if [ $rc -ne 0 ]; then show_tail "$logs/tiny_flash.log"; verdict 1 "the run failed (exit $rc)"
  elif [ ! -s "$logs/tiny_a.txt" ]; then verdict 1 "no packed run to compare with"
  else
    losses "$logs/tiny_flash" >"$logs/tiny_flash.txt"
    v=$(follows "$logs/tiny_a.txt" "$logs/tiny_flash.txt" packed flash)
    verdict $? "flash (auto) against packed: $v; $(grep -m1 '^  attention' "$logs/tiny_flash.log" | cut -c1-70)"
  fi
fi

# ---------------------------------------------------------------------------------------------
speed() {  # speed NAME DECK STEPS PEAK_GFLOPS ARGS...
  local name=$1 deck=$2 steps=$3 peak=$4
  shift 4
  local t0=$SECONDS
  limited "$XX" -in "$deck" -var steps "$steps" -var peak "$peak" -var log_every 2 -var run_dir "$logs/$name" "$@" \
    >"$logs/$name.log" 2>&1
  local rc=$?
  local perf
  perf=$(grep '^PERFORMANCE' "$logs/$name.log" | tail -1)
  if [ $rc -ne 0 ] || [ -z "$perf" ]; then
    show_tail "$logs/$name.log" 20
    grep -E '^step ' "$logs/$name.log" | tail -3 | sed 's/^/    steady: /'
    verdict 1 "$name failed (exit $rc)"
    return
  fi
  # MFU as printed is against PEAK; the measured bf16 peak (790 TFLOP/s) too.
  local mfu=${perf#*mfu=}; mfu=${mfu%% *}
  echo "SPEED $name ($steps steps): ${perf#PERFORMANCE }"
  grep -E '^step ' "$logs/$name.log" | tail -2 | sed 's/^/    steady: /'
  grep -E 'memory: peak|plan' "$logs/$name.log" | head -3 | sed 's/^/    /'
  "$PY" -c "import sys; m=float(sys.argv[1]); p=float(sys.argv[2]); print(f'    MFU {m:.4f} of the datasheet peak {p/1e3:.0f} TFLOP/s; {m*p/790000:.4f} of the measured bf16 peak 790 TFLOP/s')" "$mfu" "$peak" 2>/dev/null
  verdict 0 "$name ran $steps steps ($((SECONDS - t0)) s)"
}
if stage speed_bf16 90; then speed deepseek-gpu_bf16 input/deepseek-gpu.deck 20 989000 -var precision bf16; fi
if stage dense_probe 90; then speed dense-probe_bf16 input/dense-probe.deck 10 989000; fi

# ---------------------------------------------------------------------------------------------
if stage ranks 80; then
  t0=$SECONDS
  tiny np2 packed 2 -var steps 20
  rc=$?
  if [ $rc -ne 0 ]; then show_tail "$logs/np2.log" 25; verdict 1 "2 ranks on one GPU failed (exit $rc)"
  else
    grep -m1 'dense all-reduce' "$logs/np2.log" | sed 's/^/    /'
    grep -q 'mpi (nccl: 2 ranks on a node share 1 visible GPU' "$logs/np2.log"
    verdict $? "2 ranks on one GPU: auto passed NCCL over for MPI, saying why ($((SECONDS - t0)) s)"
    losses "$logs/np2" >"$logs/np2.txt"
    v=$(follows tests/gpu/deepseek-tiny-cpu-np2.txt "$logs/np2.txt" CPU GPU)
    verdict $? "2 ranks against the CPU build's 2 ranks: $v"
  fi
  tiny np2_shard packed 2 -var steps 20 -var shard optimizer
  rc=$?
  if [ $rc -ne 0 ]; then show_tail "$logs/np2_shard.log" 25; verdict 1 "shard optimizer at 2 ranks failed (exit $rc)"
  else
    losses "$logs/np2_shard" >"$logs/np2_shard.txt"
    v=$(follows "$logs/np2.txt" "$logs/np2_shard.txt" "shard off" "shard optimizer")
    verdict $? "shard optimizer at 2 ranks on one GPU against shard off: $v"
  fi
fi

# ---------------------------------------------------------------------------------------------
if stage hf 100; then
  t0=$SECONDS
  d="$logs/v3"
  mkdir -p "$d"
  head -c 200000 data/fortunes.txt >"$d/corpus.txt"
  cat >"$d/v3.deck" <<EOF
seed 1
model deepseek vocab 256 dim 64 layers 3 heads 4 ffn 128 seq 64 norm_eps 1e-6 init_std 0.2
attention mla kv_lora_rank 32 q_lora_rank 48 qk_nope_dim 16 rope_dim 8 v_dim 16
moe on dense_layers 1 shared 1 routed 8 topk 2 ffn 32 gate sigmoid balance bias balance_coef 0.02 route_scale 1.5
mtp depth 1 weight 0.3
data bytes $d/corpus.txt valid 0.1 batch 4 workers 1
optimizer adamw lr 1e-2
output dir $d/run log_every 1
eval every 0 batches 2
run 6
EOF
  limited "$XX" -in "$d/v3.deck" >"$logs/hf_train.log" 2>&1
  rc=$?
  if [ $rc -ne 0 ]; then show_tail "$logs/hf_train.log"; verdict 1 "training the V3-shaped model failed (exit $rc)"
  else
    ckpt=$(ls "$d"/run/ckpt/step_*.h5 | tail -1)
    prompt="The quick brown fox. Q: What is it? A:"
    # tools/ckpt export reads the checkpoint's deck through the binary (xuanxue -print-config json)
    printf '#!/usr/bin/env bash\nsource "%s/env.sh"\nxx_run "%s" "$@"\n' "$XX_BUNDLE" "$XX" >"$d/xuanxue"
    chmod +x "$d/xuanxue"
    limited "$XX" generate -ckpt "$ckpt" -prompt "$prompt" -tokens 1 -temperature 0 -logits "$d/ours.txt" \
      >"$logs/hf_generate.log" 2>&1 &&
      XUANXUE_BIN="$d/xuanxue" timeout 60 "$PY" tools/ckpt export "$ckpt" --format hf "$d/hf" >"$logs/hf_export.log" 2>&1 &&
      timeout "$((LIMIT > 20 ? LIMIT - 10 : 10))" "$PY" tools/device/hf_logits.py "$d/hf" "$d/ours.txt" >"$logs/hf_logits.log" 2>&1
    rc=$?
    cat "$logs/hf_logits.log" | grep -v Warning | tail -6 | sed 's/^/    /'
    [ $rc -eq 0 ] || { show_tail "$logs/hf_generate.log" 5; show_tail "$logs/hf_export.log" 5; }
    verdict $rc "transformers' DeepseekV3ForCausalLM on our export gives our logits ($((SECONDS - t0)) s)"
  fi
fi

# ---------------------------------------------------------------------------------------------
# The other direction, as a user's download: transformers writes its own DeepseekV3ForCausalLM (a
# tiny random config; 4 expert groups of which 2 are kept, a random selection bias; plain rope and
# YaRN) with the tokenizer saved beside it (tests/data/hf_tokenizer's, DeepSeek-V3's configuration);
# `init hf` imports it, `generate -tokenizer DIR/tokenizer.json` encodes a multilingual prompt
# (English, Chinese, rare CJK, Korean, mathematics, emoji, Go, Rust, odd separators, special tokens)
# and writes the logits at every position: transformers' ids and logits must be ours.
if stage hf_import 100; then
  t0=$SECONDS
  d="$logs/client"
  mkdir -p "$d"
  head -c 200000 data/fortunes.txt >"$d/corpus.txt"
  "$PY" - tests/data/hf_tokenizer/multilingual.txt "$d/prompt.txt" <<'PY'
import sys
paragraphs = open(sys.argv[1], encoding="utf-8").read().split("\n\n")
open(sys.argv[2], "w", encoding="utf-8").write("\n\n".join(paragraphs[i] for i in (1, 6, 9, 12, 18, 19, 31, 34, 40, 41)))
PY
  rc=0
  for variant in plain yarn; do
    m="$d/$variant"
    if ! timeout 60 "$PY" "$here/hf_client.py" make "$m" tests/data/hf_tokenizer/tokenizer.json \
      $([ $variant = yarn ] && echo --yarn) >"$logs/client_$variant.log" 2>&1; then
      show_tail "$logs/client_$variant.log" 8; rc=1; continue
    fi
    grep -v Warning "$logs/client_$variant.log" | tail -1 | sed 's/^/    /'
    printf '%s\n' "seed 1" "init hf $m seq 2048" "data bytes $d/corpus.txt valid 0.1 batch 1 workers 1" \
      "optimizer adamw lr 1e-3" "output dir $m.run log_every 1" "eval every 0" "checkpoint every 1" "run 1" >"$m.deck"
    limited "$XX" -in "$m.deck" >"$logs/client_${variant}_import.log" 2>&1 &&
      limited "$XX" generate -ckpt "$m.run/ckpt/step_00000000.h5" -tokenizer "$m/tokenizer.json" \
        -prompt "$(cat "$d/prompt.txt")" -tokens 1 -temperature 0 -logits "$m.ours.txt" \
        >"$logs/client_${variant}_generate.log" 2>&1 &&
      timeout 60 "$PY" "$here/hf_client.py" ids "$m" "$m.ours.txt" "$d/prompt.txt" >"$logs/client_${variant}_ids.log" 2>&1
    r=$?
    grep -E '^(ids|decode)' "$logs/client_${variant}_ids.log" 2>/dev/null | sed "s/^/    $variant /"
    if [ $r -eq 0 ]; then
      timeout "$((LIMIT > 40 ? 40 : LIMIT))" "$PY" "$here/hf_logits.py" "$m" "$m.ours.txt" \
        >"$logs/client_${variant}_logits.log" 2>&1
      r=$?
      grep -v Warning "$logs/client_${variant}_logits.log" | tail -2 | sed "s/^/    $variant /"
    else
      show_tail "$logs/client_${variant}_import.log" 5; show_tail "$logs/client_${variant}_generate.log" 5
      show_tail "$logs/client_${variant}_ids.log" 5
    fi
    [ $r -eq 0 ] || rc=1
  done
  verdict $rc "transformers' own DeepseekV3ForCausalLM and tokenizer, imported: the same ids and logits ($((SECONDS - t0)) s)"
fi

# ---------------------------------------------------------------------------------------------
if stage unit 75; then
  t0=$SECONDS
  tags='[kernels],[gemm],[precision],[flash],[team],[compress],[decode],[model],[optimizer],[lossagg],[device],[ckpt_codec]'
  limited bin/unit_tests "$tags" >"$logs/unit.log" 2>&1
  rc=$?
  [ $rc -eq 0 ] || grep -B3 -A12 -m3 'FAILED' "$logs/unit.log" | head -60 | sed 's/^/    | /'
  verdict $rc "unit_tests $tags: $(grep -E '^(All tests passed|test cases:)' "$logs/unit.log" | tail -1) ($((SECONDS - t0)) s)"
fi

if stage speed_tf32 60; then speed deepseek-gpu_tf32 input/deepseek-gpu.deck 8 494000 -var precision "fp32 products tf32"; fi

# ---------------------------------------------------------------------------------------------
if ! command -v compute-sanitizer >/dev/null; then echo "=== sanitize: compute-sanitizer not found"
elif stage sanitize 120; then
  t0=$SECONDS
  limited compute-sanitizer --tool memcheck --error-exitcode 3 "$XX" -in input/deepseek-tiny.deck -var steps 1 \
    -var seq 32 -var log_every 1 -var eval_every 0 -var ckpt_every 0 -var run_dir "$logs/sanitize" \
    >"$logs/sanitize.log" 2>&1
  rc=$?
  grep -E 'ERROR SUMMARY|Invalid|out of bounds' "$logs/sanitize.log" | head -8 | sed 's/^/    /'
  [ $rc -eq 124 ] && verdict 1 "memcheck did not finish within ${LIMIT} s" ||
    verdict $rc "compute-sanitizer memcheck, 1 step of deepseek-tiny at seq 32 (exit $rc, $((SECONDS - t0)) s)"
fi

echo "# checks: ${#failed[@]} failed${failed:+ (${failed[*]})}, in $SECONDS s"
tar -C "$logs" -czf "$out/logs.tar.gz" --exclude='*.h5' --exclude='*.safetensors' . 2>/dev/null
[ ${#failed[@]} -eq 0 ]
