#!/usr/bin/env bash
# Issue #19 (CUDA-graph sampler) on a lent H200, in device calls of at most 10 minutes each:
#   bash scripts/h200_issue19.sh first    # engine GPU tests, then rollout bench (engine bf16/NVFP4, loop, HF static)
#   bash scripts/h200_issue19.sh final    # engine GPU tests, rollout bench (all variants), whole step
#   bash scripts/h200_issue19.sh step     # whole GRPO step bf16 vs NVFP4 with the engine, then the GPU suite
#   bash scripts/h200_issue19.sh rollout  # rollout bench only, with kernel profiles
#   bash scripts/h200_issue19.sh packed   # GPU tests of the packed NVFP4 groups, whole step with token-budget
#                                         # micro-batches, rollout with and without packing
#   bash scripts/h200_issue19.sh profile  # the whole step per phase under the profiler (bf16 and both NVFP4
#                                         # weight layouts), then the rollout bench with kernel tables
# Everything goes to $OUT (the device tool's output folder) or ./h200_out; summary.txt lists each step's
# exit status and last line, so a step that runs out of time still leaves the others' results.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD HF_HUB_OFFLINE=1
source "$(dirname "$0")/device_common.sh"
case "${1:-}" in
first)
    step gpu_tests 150 python3 -m pytest tests/rollout/test_graph_sampler.py tests/rollout/test_attention.py \
        tests/minite_kernels/test_compile_op.py -m gpu -q -p no:cacheprovider -rfE
    step rollout 230 python3 scripts/bench_rollout.py \
        --variants graph_bf16,graph_nvfp4,graph-sdpa_bf16,loop_bf16,hf_static_bf16,hf_static_nvfp4 --profile "$out/prof"
    step trainer 130 python3 scripts/bench_trainer.py --reps 2
    ;;
final)
    step gpu_tests 110 python3 -m pytest tests/rollout/test_graph_sampler.py tests/rollout/test_attention.py \
        tests/minite_kernels/test_compile_op.py -m gpu -q -p no:cacheprovider -rfE
    step rollout 230 python3 scripts/bench_rollout.py --profile "$out/prof" \
        --variants graph_bf16,graph_nvfp4,graph-nopack_bf16,loop_bf16,hf_static_bf16,hf_static_nvfp4
    step trainer 100 python3 scripts/bench_trainer.py --reps 2
    ;;
step)
    step trainer 330 python3 scripts/bench_trainer.py --reps 2
    step gpu_suite 240 python3 -m pytest tests -m gpu -q -p no:cacheprovider -rfE
    ;;
packed)
    step gpu_tests 110 python3 -m pytest tests/rollout/test_graph_sampler.py -m gpu -q -p no:cacheprovider -rfE \
        -k "nvfp4 or weight_update or every_bucket"
    step trainer 150 python3 scripts/bench_trainer.py --reps 2 --micro-batch 64 --micro-batch-tokens 32768
    step rollout 100 python3 scripts/bench_rollout.py --variants graph_bf16,graph_nvfp4,graph-nopack_nvfp4
    ;;
profile)
    step trainer 300 python3 scripts/bench_trainer.py --reps 2 --profile "$out/prof_step" \
        --recipes bf16,nvfp4_per_token_bf16_bwd,nvfp4_per_token_w1x16_bf16_bwd
    step rollout 200 python3 scripts/bench_rollout.py --variants graph_bf16,graph_nvfp4,hf_static_nvfp4 \
        --profile "$out/prof_rollout"
    ;;
rollout)
    step rollout 560 python3 scripts/bench_rollout.py --variants graph_bf16,graph_nvfp4,eager_bf16,eager_nvfp4 \
        --profile "$out/prof"
    ;;
*)
    echo "usage: $0 first|final|step|rollout|profile|packed" >&2
    exit 2
    ;;
esac
cat "$out/summary.txt"
