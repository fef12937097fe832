"""``python -m trainers.grpo [recipe=NAME] [key=value ...]``: GRPO training (engine=local or engine=verl).

    python -m trainers.grpo                                   # embedded default: SmolLM2-135M on CPU, < 10 min
    python -m trainers.grpo recipe=triage_nvfp4 model.path=Qwen/Qwen3-4B data.task=gsm8k
    python -m trainers.grpo --keys                            # every config key with its default
    python -m trainers.grpo --recipes                         # the training recipes found
"""
from __future__ import annotations

import json
import sys


def main(argv: list[str] | None = None) -> int:
    from trainers.config import ConfigError, all_keys, list_recipes, load_config

    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    if args and args[0] == "--keys":
        print("\n".join(all_keys()))
        return 0
    if args and args[0] == "--recipes":
        print("\n".join(list_recipes()))
        return 0
    try:
        cfg = load_config(args)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    from rollout.models import ModelLoadError
    from trainers.checkpoint import CheckpointError
    from trainers.data import DatasetError
    from trainers.rewards.registry import RewardError

    try:
        if cfg.engine == "verl":
            from trainers.engines.verl import VerlUnavailable, run_verl

            try:
                return run_verl(cfg)
            except VerlUnavailable as e:
                print(f"error: {e}", file=sys.stderr)
                return 1
        from trainers.engines.local import run_local

        result = run_local(cfg)
    except (ConfigError, DatasetError, ModelLoadError, RewardError, CheckpointError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except Exception as e:
        if type(e).__name__ in ("TrainingDiverged", "AlignmentError"):
            print(f"error: {e}", file=sys.stderr)
            return 1
        raise
    print(json.dumps({"run_dir": result["run_dir"], "checkpoint": result["checkpoint"],
                      "stopped": result.get("stopped", False)}))
    if result.get("stopped"):  # SIGTERM: the step in progress finished and was saved (trainers.stopping)
        from trainers.stopping import EXIT_STOPPED

        return EXIT_STOPPED
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
