#!/usr/bin/env bash
# Issue #6 on a lent GPU, in device calls of at most 10 minutes each:
#   bash scripts/h200_issue6.sh tests    # GPU tests, one log per file, then all with decode routing (5-8 min)
#   bash scripts/h200_issue6.sh bench    # decode, quantize A/B, weight sync, model (6-8 min)
#   bash scripts/h200_issue6.sh probe    # learner-shape quantize sweep, sync launch sizes, model, host profile
#   bash scripts/h200_issue6.sh launch   # host cost per quantize launch, per quantized linear, per model step
#   bash scripts/h200_issue6.sh verify   # whole GPU suite on the defaults, interleaved model step, linears
#   bash scripts/h200_issue6.sh optim    # whole GPU suite, AdamW with amax + weight sync fed by it, launch cost
#   bash scripts/h200_issue6.sh layout   # quantize byte tests, tile-layout rooflines + sweeps, learner shapes, sync
#   bash scripts/h200_issue6.sh decode   # whole GPU suite on the defaults (pair decode on), decode at batch 1-16
#   bash scripts/h200_issue6.sh pdl      # decode tests (PDL on/off, graph chain), block chains, cold launch sweep
#   bash scripts/h200_issue6.sh regbuf   # cold launch sweep with the register double buffer, block chains
#   bash scripts/h200_issue6.sh regcheck # block chains at the new defaults, decode + patching GPU tests
# Everything goes to $OUT (the device tool's output folder) or ./h200_out; summary.txt lists each step's
# exit status and last line, so a step that runs out of time still leaves the others' results.
set -u
out=${OUT:-h200_out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
step() {  # step NAME SECONDS COMMAND...
    local name=$1 secs=$2
    shift 2
    timeout "$secs" "$@" > "$out/$name.log" 2>&1
    echo "$name rc=$? $(tail -n 1 "$out/$name.log")" >> "$out/summary.txt"
}
case "${1:-}" in
tests)
    for t in test_triton_decode test_triton_kernels test_patching; do
        step "$t" 150 python3 -m pytest "tests/minite_kernels/$t.py" -m gpu -q -p no:cacheprovider -rfE
    done
    # the whole GPU suite again with decode routing on
    step all_decode_auto 240 env MINITE_TRITON_DECODE=auto \
        python3 -m pytest tests -m gpu -q -p no:cacheprovider -rfE
    ;;
bench)
    step decode 170 python3 scripts/bench_kernels.py --only decode --decode-batches 1,2,4,16 \
        --out "$out/decode.jsonl"
    step quantize_sweeps 140 python3 scripts/bench_quantize_sweeps.py
    step model 150 python3 scripts/bench_kernels.py --only model --model-rounds 6 --out "$out/model.jsonl"
    step linear 90 python3 scripts/bench_kernels.py --only linear --out "$out/linear.jsonl"
    ;;
probe)  # learner-shape quantize sweep, weight-sync launch sizes, interleaved model step, host profile
    step quantize 240 python3 scripts/bench_quantize_sweeps.py --only learner,sync_sweep,ab,sync
    step model 180 python3 scripts/bench_kernels.py --only model --model-rounds 5 --out "$out/model.jsonl"
    step host 100 python3 scripts/bench_host_overhead.py --device cuda --profile triton/nvfp4_per_token_bf16_bwd
    ;;
launch)  # host cost per quantize launch, per quantized linear (lane on/off), per model step at seq 32
    step launch 120 python3 scripts/bench_launch_overhead.py --rounds 4
    step host 120 python3 scripts/bench_host_overhead.py --device cuda \
        --cases torch_linear,autograd_function_floor,triton/nvfp4_per_token_bf16_bwd \
        --env-variants MINITE_LINEAR_LANE=auto,off
    step model_host 100 python3 scripts/bench_kernels.py --only model --seq 32 --model-rounds 5 \
        --model-variants MINITE_LINEAR_LANE=auto,off --out "$out/model_host.jsonl"
    step host_profile 100 python3 scripts/bench_kernels.py --only model --seq 32 --host-profile
    ;;
verify)  # the whole GPU suite on the defaults, the interleaved model step (+ profile), linears, quantize
    step gpu_tests 240 python3 -m pytest tests -m gpu -q -p no:cacheprovider -rfE
    step model 170 python3 scripts/bench_kernels.py --only model --model-rounds 7 --profile \
        --model-variants MINITE_LINEAR_LANE=auto,off --out "$out/bench.jsonl"
    step linear 80 python3 scripts/bench_kernels.py --only linear --out "$out/bench.jsonl"
    step quantize 75 python3 scripts/bench_quantize_sweeps.py --only ab,sync
    ;;
optim)  # the whole GPU suite, the optimizer's amax feeding weight sync, launch cost with address arguments
    step gpu_tests 260 python3 -m pytest tests -m gpu -q -p no:cacheprovider -rfE
    step optim 150 python3 scripts/bench_kernels.py --only optim --optim-sweep --out "$out/optim.jsonl"
    step launch 110 python3 scripts/bench_launch_overhead.py --rounds 4
    ;;
layout)  # the quantize kernels' byte tests, tile-layout rooflines and launch sweeps, per-token learner shapes,
    # the weight sync fed by the optimizer's amax (the sixth session's measurements, 6-9 minutes)
    step quant_tests 190 python3 -m pytest tests/minite_kernels/test_triton_kernels.py \
        tests/minite_kernels/test_fast_lane.py tests/minite_kernels/test_modules_weight_sync.py \
        -m gpu -q -p no:cacheprovider -rfE
    step layout 170 python3 scripts/bench_quant_layout.py
    step learner 150 python3 scripts/bench_quantize_sweeps.py --only learner
    step optim 60 python3 scripts/bench_kernels.py --only optim --out "$out/optim.jsonl"
    ;;
decode)  # the pair decode kernel (seventh session): every GPU test with it routed, then its benchmark
    step gpu_suite 330 python3 -m pytest tests -m gpu -q -p no:cacheprovider -rfE
    step decode 150 python3 scripts/bench_decode.py --batches 1,2,4,8,16 --out "$out/decode.jsonl"
    ;;
pdl)  # programmatic dependent launch on the decode path (eighth session)
    step decode_tests 320 python3 -m pytest tests/minite_kernels/test_triton_decode.py -m gpu -q \
        -p no:cacheprovider -rfE
    step chain 140 python3 scripts/bench_decode.py --only-chain --fused --batches 1,2,4,16 \
        --out "$out/chain.jsonl"
    step cold 120 python3 scripts/bench_decode.py --only-chain --cold-sweep --batches 1,2,4 \
        --out "$out/cold.jsonl"
    ;;
regbuf)  # the pair kernel's K loop double-buffered in registers (ninth session)
    step cold 260 python3 scripts/bench_decode.py --only-chain --cold-sweep --batches 1,2,4 \
        --out "$out/cold.jsonl"
    step chain 240 python3 scripts/bench_decode.py --only-chain --fused --batches 1,2,4,16 \
        --out "$out/chain.jsonl"
    ;;
regcheck)  # the ninth session's launch defaults: block chains first, then the GPU tests they must pass
    step chain 150 python3 scripts/bench_decode.py --only-chain --fused --batches 1,2,4,16 \
        --out "$out/chain.jsonl"
    step decode_tests 360 python3 -m pytest tests/minite_kernels/test_triton_decode.py -m gpu -q \
        -p no:cacheprovider -rfE
    step patching_tests 60 python3 -m pytest tests/minite_kernels/test_patching.py -m gpu -q \
        -p no:cacheprovider -rfE
    ;;
*)
    echo "usage: bash scripts/h200_issue6.sh tests|bench|probe|launch|verify|optim|layout|decode|pdl|regbuf|regcheck" >&2
    exit 2
    ;;
esac
cat "$out/summary.txt"
