#!/usr/bin/env bash
# The device check, run on the GPU machine from the repository root:
#   run(command="bash benches/gpu_check.sh", carry=["python/logitsproc_rs/_core.abi3.so"])
# That machine's python3 already has torch with CUDA (and pytest) but no Rust toolchain, so the
# extension travels prebuilt: `make build` makes an abi3 build (any CPython >= 3.10).
# Everything it prints also lands in $OUT (the device tool brings that folder back).
set -uo pipefail
OUT=${OUT:-/tmp/logitsproc_gpu_check}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1
status=0
step() {  # step NAME SECONDS CMD...: run with a time limit, log to $OUT/NAME.txt
    local name=$1 limit=$2
    shift 2
    echo "=== $name"
    timeout "$limit" "$@" 2>&1 | tee "$OUT/$name.txt"
    local rc=${PIPESTATUS[0]}
    echo "=== $name: exit $rc"
    [ "$rc" -eq 0 ] || status=1
}
# Limits add up to 5.2 minutes, so a second run fits the 15 minutes of device time.
step env 20 python3 -c "import torch, logitsproc_rs; print(torch.__version__, torch.cuda.get_device_name(), logitsproc_rs.__version__)"
# CUDA vs CPU exactness, pinned staging, uploads (span and packed), no sync in apply.
step cuda_tests 140 python3 -m pytest -q -p no:cacheprovider -W default tests/test_cuda.py tests/test_triton.py tests/test_builtin_penalties.py tests/test_builtin_bad_words.py tests/test_builtin_allowed_token_ids.py tests/test_bitmask.py tests/test_sampler_logprobs.py tests/test_sampler_transforms.py tests/test_params_validation.py tests/test_reference.py tests/bad_input/test_params_transforms.py tests/test_pipeline.py tests/bad_input/test_logits.py tests/bad_input/test_calls.py
step kernels 40 python3 benches/kernels.py --iters 30
step bench 70 python3 benches/report.py --device cuda --quick --no-appendix --out "$OUT/bench-report.md"
step demo 40 python3 -m logitsproc_rs demo --device cuda --steps 100
# The sort-free sampling tail's Triton kernel against apply_top_k_top_p + random_sample (medians;
# adds at most 1 minute, compiles included).
step sampling_tail 60 python3 tests/test_triton_sampling.py --bench
exit $status
