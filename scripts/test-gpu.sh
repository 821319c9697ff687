#!/usr/bin/env bash
# The GPU checks (CI has no GPU): the tests that need CUDA, then the runtime benchmark's speed and memory sections on
# the GPU in bf16. Run on a machine with a CUDA build of torch and the package's dependencies importable (PYTHON
# names the interpreter, default python3); its output and the benchmark's record go to $OUT (default /tmp/papa-gpu-check).
set -uo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
out=${OUT:-/tmp/papa-gpu-check}
mkdir -p "$out"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
$python -c "import torch; assert torch.cuda.is_available(), 'no GPU'; print(torch.__version__, torch.cuda.get_device_name())" || exit 1
status=0
$python -m pytest -q -p no:cacheprovider -m "" -rfs --timeout 600 tests/test_gpu.py \
  tests/test_public_api.py::test_calibration_on_another_device_brings_the_model_back \
  tests/test_distributed_cli.py::test_exchanged_batches_add_up_like_one_process \
  "tests/test_checkpoint.py::test_loaded_in_bf16_every_weight_has_the_sources_dtype_and_it_runs_where_the_source_runs" \
  2>&1 | tee "$out/tests.txt" || status=1
$python benchmarks/bench_runtime.py --device cuda --dtype bfloat16 --batch-scale "${BATCH_SCALE:-8}" \
  --sections speed memory --repeats "${REPEATS:-20}" --save cuda 2>&1 | tee "$out/bench_runtime-cuda.log" || status=1
cp benchmarks/results/bench_runtime-cuda.* "$out/" 2>/dev/null  # the record (machine, versions, commit, rows)
exit $status
