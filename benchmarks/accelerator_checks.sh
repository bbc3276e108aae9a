#!/bin/bash
# The accelerator checks of one lent GPU session, prepared to run as one command (device time is short):
#
#   bash benchmarks/accelerator_checks.sh OUT_DIR [PYTHON]
#
# 1. what jax sees; 2. the kernel tests that need a GPU (cuDNN against XLA in bf16, 200 training steps);
# 3. MFU at GPT-2-small size, the explicit path against cuDNN (and cuDNN with the chunked loss);
# 4. XLA GPU flags one at a time on the cuDNN step. Each step writes under OUT_DIR and a failure does not stop
# the next, so whatever finished comes back.
OUT=${1:?usage: accelerator_checks.sh OUT_DIR [PYTHON]}
PY=${2:-python}
mkdir -p "$OUT"
$PY -c "import jax, flax, optax; print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__,
jax.default_backend(), jax.devices())" 2>&1 | tee "$OUT/devices.txt"
timeout 900 $PY -m pytest -q -p no:cacheprovider -n 0 tests/test_attention_kernels.py 2>&1 | tail -30 | tee "$OUT/kernel_tests.txt"
timeout 900 $PY -m benchmarks.accelerator_mfu --sizes=gpt2_small,gpt2_small_swa,paper_gpu_L4 --repeats=3 --steps=10 \
  --variants=bfloat16:xla,bfloat16:cudnn,bfloat16:cudnn:1024 --json="$OUT/mfu_gpt2_small.json" 2>&1 | tail -8 \
  | tee "$OUT/mfu_gpt2_small.txt"
for flags in "" "--xla_gpu_enable_latency_hiding_scheduler=true" "--xla_gpu_enable_triton_gemm=false" \
             "--xla_gpu_enable_highest_priority_async_stream=true"; do
  name=$(echo "${flags:-none}" | tr -c 'a-z0-9\n' '_')
  XLA_FLAGS="$flags" timeout 600 $PY -m benchmarks.accelerator_mfu --sizes=gpt2_small --repeats=3 --steps=10 \
    --variants=bfloat16:cudnn --json="$OUT/flags_$name.json" 2>&1 | tail -3 | tee "$OUT/flags_$name.txt"
done
