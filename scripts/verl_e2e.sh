#!/usr/bin/env bash
# Ran on one H100 on 2026-12-06 (benchmarks/RESULTS.md): 20 verl steps with a checkpoint and a resume, and the
# engine=local comparison.
#
# engine=verl end to end on one GPU: verl's GRPO trainer (FSDP2 actor with minite's NVFP4 linears, the TRIAGE
# loss) with the minite rollout (rollout.name=minite: the project's CUDA-graph sampler under the learner's own
# W4A4 recipe), on the embedded model, for $STEPS steps with wandb offline: the first half, a checkpoint, then a
# resumed second half. Then engine=local on the same recipe, seed and data, and one JSON comparing the two
# (reward curve, mean |delta| and q05, gated fraction, step time): $OUT/verl_e2e_metrics.json.
#
#   OUT=verl_e2e_out STEPS=20 bash scripts/verl_e2e.sh
#
#   ONLY="install preflight rollout_check" ... bash scripts/verl_e2e.sh   # only these steps (a 10-minute device call
#                                                                     # each; later ones reuse $OUT's runs)
#
# Needs: one CUDA GPU; torch, verl 0.9.1 and ray importable by $PY (on the lent machine, which reaches no package
# index: scripts/device_wheels.py packs the wheels into parts carried one per call, and
# scripts/device_wheels_install.sh installs them); this checkout (its verl.plugins entry points register
# rollout.name=minite and the triage loss, so it is installed editable below, without build isolation: no index). Steps run through
# device_common.sh's `step`: each has a time limit, its log in $OUT/NAME.log and a line in $OUT/summary.txt.
set -u
cd "$(dirname "$0")/.."
PY=${PY:-python}
STEPS=${STEPS:-20}
HALF=$((STEPS / 2))
export OUT=${OUT:-verl_e2e_out}
source scripts/device_common.sh
export WANDB_MODE=offline HF_HUB_OFFLINE=1
ONLY=${ONLY:-}
if [ -z "$ONLY" ] && { [ -e "$out/verl" ] || [ -e "$out/local" ]; }; then
    echo "error: $out already holds runs (verl/, local/); choose another OUT, or name the steps to run in ONLY" >&2
    exit 1
fi
# `step` for the steps ONLY names (all when it is empty)
run() {
    if [ -n "$ONLY" ] && [[ " $ONLY " != *" $1 "* ]]; then
        return 0
    fi
    step "$@"
}

# 0. the entry points, and what the run needs, before anything long starts
run install 600 $PY -m pip install -q --no-deps --no-build-isolation -e .
run preflight 300 $PY -c "
import importlib.metadata as md, torch, ray, verl
from verl.workers.rollout.base import get_rollout_class
from verl.workers.rollout.replica import RolloutReplicaRegistry
assert torch.cuda.is_available(), 'no CUDA device'
print('gpu', torch.cuda.get_device_name(), 'torch', torch.__version__, 'verl', verl.__version__, 'ray', ray.__version__)
print('rollout', get_rollout_class('minite'), RolloutReplicaRegistry.get('minite'))
print('plugins', [e.value for e in md.entry_points(group='verl.plugins')])
"
# 1. the Ray wiring of the rollout on this GPU (server actor -> actor worker -> CUDA-graph sampler), ~1 min
run rollout_check 900 $PY scripts/verl_rollout_check.py --device cuda --recipe nvfp4_per_token_w1x16_bf16_bwd

COMMON=(recipe=triage_nvfp4 trainer.seed=0 logger.wandb.mode=offline trainer.save_every="$HALF")
VERL=(engine=verl trainer.output_dir="$out/verl" verl.n_gpus_per_node=1 verl.rollout=minite)
# 2. the overrides alone (verl.dry_run), then steps 1..HALF with a checkpoint at HALF
run verl_dry_run 600 $PY -m trainers.grpo "${COMMON[@]}" "${VERL[@]}" trainer.max_steps="$STEPS" verl.dry_run=true
run verl_first_half 3600 $PY -m trainers.grpo "${COMMON[@]}" "${VERL[@]}" trainer.max_steps="$HALF" \
    trainer.resume=never
# 3. resume from the checkpoint of step HALF and run to STEPS
run verl_resume 3600 $PY -m trainers.grpo "${COMMON[@]}" "${VERL[@]}" trainer.max_steps="$STEPS" trainer.resume=auto
ls -R "$out/verl/checkpoints" > "$out/verl_checkpoints.txt" 2>&1
# 4. engine=local: the same recipe, seed and data
run local 3600 $PY -m trainers.grpo "${COMMON[@]}" engine=local trainer.output_dir="$out/local" \
    trainer.max_steps="$STEPS"
# 5. the comparison
if [ -z "$ONLY" ] || [[ " $ONLY " == *" metrics "* ]]; then
    $PY scripts/verl_e2e_metrics.py verl="$out/verl" local="$out/local" > "$out/verl_e2e_metrics.json" \
        2> "$out/verl_e2e_metrics.log"
    echo "metrics rc=$?" >> "$out/summary.txt"
fi
cat "$out/summary.txt"
