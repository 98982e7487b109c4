#!/usr/bin/env bash
# The GPU benchmarks in one command, on a fresh GPU machine with no network:
#
#   bash benchmarks/gpu.sh [STAGE ...]        # default: profile-base profile-large table
#
# It installs the carried wheels (.carry/wheels, made once by experiments/gpu/prepare.sh on a
# machine with the package registry; the CUDA image has jax, flax, optax, orbax, torch and
# transformers but not ml_collections), prints the device and versions, then runs each stage
# under its own time limit, so one that overruns or fails leaves the others' figures:
#
#   profile-base   benchmarks/profile_step.py --row=bert-base-512, variants model.dropout=0
#                  and train.batch_size=256                                     (limit 260 s)
#   profile-large  the same for bert-large-512, variant model.dropout=0          (limit 300 s)
#   table          benchmarks/table.py, every GPU row, ours then HF eager then HF compiled
#                  (limit 1,800 s: split it with rows=...)
#   rows=R1,R2     benchmarks/table.py for the named rows                         (limit 540 s)
#                  (HF=eager picks the HF peers, TABLE_OVERRIDES=a.b=c,... adds overrides)
#   ab=ROW         benchmarks/table.py --variants for ROW: its step as is, under each of $VARIANTS
#                  (default: AB_VARIANTS below, the issue-23 options one by one, then together),
#                  and as is again; tokens/s over the first cell's, 40 timed steps   (limit 400 s)
#   init=ROW       benchmarks/init_time.py for ROW: where the time to its first step goes
#                                                                                 (limit 240 s)
#   flags=ROW      benchmarks/xla_flags_check.py for ROW at batch $FLAGS_BATCH (default 8): do
#                  the cuBLASLt, cuDNN LayerNorm and Triton GEMM flag sets leave its loss and
#                  gradients as they are?                                          (limit 300 s)
#   gpu-tests      the tests that need a GPU (cuDNN attention against XLA's, values and
#                  gradients, BERT's and T5's; FP8 matmuls as FP8 GEMMs, and their values and
#                  gradients against numpy's)                                    (limit 120 s)
#   smoke          bert-mini-128 profiled and tabled against HF eager, float32, 3 steps: the
#                  CPU stand-in of the above (PYTHON=path/to/venv/python bash benchmarks/gpu.sh smoke)
#
# STAGE=seconds overrides a limit (e.g. profile-base=200, rows=300 for every rows=R1,R2 stage). Everything lands in OUTDIR (default
# $OUT where the machine sets it, else runs/gpu): gpu.log (all output), profile-*.json,
# table.jsonl, and traces-ROW.tar.gz (the profiler traces and optimised HLO, when under 16 MB).
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
OUTDIR=${OUTDIR:-${OUT:-runs/gpu}}
mkdir -p "$OUTDIR"
exec > >(tee -a "$OUTDIR/gpu.log") 2>&1
export PYTHONUNBUFFERED=1

if [ -d .carry/wheels ] && ! "$PYTHON" -c "import ml_collections" 2>/dev/null; then
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site \
    .carry/wheels/*.whl || exit 2
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

echo "== $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null
"$PYTHON" - <<'EOF' || exit 2
import importlib.metadata as md, platform, jax
names = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy", "torch", "transformers")
def version(name):
  try:
    return md.version(name)
  except md.PackageNotFoundError:
    return "absent"
print("python", platform.python_version(), "|", ", ".join(f"{n} {version(n)}" for n in names))
print("devices:", jax.devices())
import bertfam_jax.train.step  # noqa: F401  the project imports with this stack
EOF

TRACES=$(mktemp -d)
run_stage() {  # name default_limit_s command...: the command under the stage's time limit
  local name=$1 limit=$2 override
  shift 2
  for override in "${OVERRIDES[@]}"; do
    [ "${override%%=*}" = "$name" ] && limit=${override#*=}
  done
  echo "== $(date -u +%T) $name (limit ${limit} s): $*"
  local start=$SECONDS
  timeout --kill-after=10 "$limit" "$@"
  echo "== $name exit $? after $((SECONDS - start)) s"
}

# Each speed option of issue 23 against the fast path (which fuses Q, K and V): unfused, then the
# opt-in ones alone and together, then an XLA flag set.
AB_VARIANTS="unfused-qkv=model.fused_qkv=false;vocab128=model.vocab_multiple=128;\
bits16=model.dropout_bits=16;rbg=train.rng_impl=rbg;\
all=model.vocab_multiple=128,model.dropout_bits=16,train.rng_impl=rbg;fp8=model.fp8_matmuls=true;\
cublaslt=--xla_gpu_enable_cublaslt=true"

OVERRIDES=(none=0)
STAGES=()
for arg in "$@"; do
  if [[ $arg =~ ^[a-z-]+=[0-9]+$ ]]; then OVERRIDES+=("$arg"); else STAGES+=("$arg"); fi
done
[ ${#STAGES[@]} -gt 0 ] || STAGES=(profile-base profile-large table)

for stage in "${STAGES[@]}"; do
  case $stage in
    profile-base)
      run_stage profile-base 260 "$PYTHON" benchmarks/profile_step.py \
        --row=bert-base-512 --trace_steps=3 --variant=model.dropout=0 \
        --variant=train.batch_size=256 --trace_dir="$TRACES/bert-base-512" \
        --output="$OUTDIR/profile-bert-base-512.json" ;;
    profile-large)
      run_stage profile-large 300 "$PYTHON" benchmarks/profile_step.py \
        --row=bert-large-512 --trace_steps=3 --variant=model.dropout=0 \
        --trace_dir="$TRACES/bert-large-512" --output="$OUTDIR/profile-bert-large-512.json" ;;
    table)
      run_stage table 1800 "$PYTHON" benchmarks/table.py \
        --output="$OUTDIR/table.jsonl" ;;
    rows=*)
      run_stage rows 540 "$PYTHON" benchmarks/table.py --rows="${stage#rows=}" \
        --hf="${HF-eager,compile}" --overrides="${TABLE_OVERRIDES:-}" \
        --output="$OUTDIR/table.jsonl" ;;
    ab=*)
      run_stage ab 400 "$PYTHON" benchmarks/table.py --rows="${stage#ab=}" --hf= --steps=40 \
        --variants="${VARIANTS:-$AB_VARIANTS}" --output="$OUTDIR/ab.jsonl" ;;
    init=*)
      run_stage init 240 "$PYTHON" benchmarks/init_time.py --row="${stage#init=}" \
        --output="$OUTDIR/init.jsonl" ;;
    flags=*)
      run_stage flags 300 "$PYTHON" benchmarks/xla_flags_check.py --row="${stage#flags=}" \
        --batch="${FLAGS_BATCH:-8}" --output="$OUTDIR/flags.jsonl" ;;
    gpu-tests)
      # JAX_PLATFORMS empty: the GPU where there is one (tests/conftest.py defaults to the CPU).
      JAX_PLATFORMS= JAX_DISABLE_MOST_OPTIMIZATIONS=0 run_stage gpu-tests 120 "$PYTHON" -m pytest \
        -q -n0 -p no:cacheprovider -rs tests/models/encoder_test.py tests/models/t5_model_test.py \
        tests/models/fp8_test.py -k "cudnn or fp8_gemm or forward_and_both" ;;
    smoke)
      # The CPU alone: with libtpu installed (the tpu-aot and test extras) an unset JAX_PLATFORMS
      # loads its TPU plugin, whose profiler crashes jax.profiler.trace (jax 0.10.2, libtpu 0.0.52).
      JAX_PLATFORMS=cpu run_stage smoke 300 "$PYTHON" benchmarks/profile_step.py \
        --row=bert-mini-128 --fast_path=false --steps=3 --warmup=1 --trace_steps=1 \
        --variant=model.dropout=0 --trace_dir="$TRACES/bert-mini-128" \
        --output="$OUTDIR/profile-bert-mini-128.json"
      JAX_PLATFORMS=cpu run_stage smoke 300 "$PYTHON" benchmarks/table.py --rows=bert-mini-128 \
        --fast_path=false --hf=eager --steps=3 --warmup=1 --output="$OUTDIR/table.jsonl" ;;
    *) echo "error: unknown stage '$stage' (profile-base, profile-large, table, rows=R1,R2, ab=ROW, init=ROW, flags=ROW, gpu-tests, smoke)"
       exit 2 ;;
  esac
done

# Each row's traces and optimised HLO (to re-read the profile elsewhere with
# profile_step.attribute), when they fit in 16 MB.
for dir in "$TRACES"/*/; do
  [ -d "$dir" ] || continue
  row=$(basename "$dir")
  find "$dir" -name '*.xplane.pb' -delete
  tar -czf "$OUTDIR/traces-$row.tar.gz" -C "$dir" .
  if [ "$(stat -c %s "$OUTDIR/traces-$row.tar.gz")" -gt 16000000 ]; then
    echo "traces-$row.tar.gz over 16 MB: left out"
    rm "$OUTDIR/traces-$row.tar.gz"
  fi
done
rm -rf "$TRACES"
echo "== $(date -u +%T) done"
