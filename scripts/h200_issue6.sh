#!/usr/bin/env bash
# Issue #6 on a lent GPU, in device calls of at most 10 minutes each:
#   bash scripts/h200_issue6.sh tests    # GPU tests, one log per file (3-5 min)
#   bash scripts/h200_issue6.sh bench    # decode, quantize A/B, weight sync, model (6-8 min)
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
        step "$t" 200 python3 -m pytest "tests/minite_kernels/$t.py" -m gpu -q -p no:cacheprovider -rfE
    done
    ;;
bench)
    step decode 200 python3 scripts/bench_kernels.py --only decode --decode-batches 1,2,4,16 \
        --out "$out/decode.jsonl"
    step quantize_impls 150 python3 scripts/bench_quantize_impls.py
    step model_v1 80 env MINITE_TRITON_QUANT_IMPL=v1 python3 scripts/bench_kernels.py --only model \
        --out "$out/model_v1.jsonl"
    step model_v2 80 env MINITE_TRITON_QUANT_IMPL=v2 python3 scripts/bench_kernels.py --only model \
        --out "$out/model_v2.jsonl"
    ;;
*)
    echo "usage: bash scripts/h200_issue6.sh tests|bench" >&2
    exit 2
    ;;
esac
cat "$out/summary.txt"
