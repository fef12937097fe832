"""``python -m trainers.controlled [STUDY.yaml] [key=value ...]``: run (or finish) the controlled study.

With no study file the code defaults run (``trainers.controlled.config``); ``--print-config`` prints the resolved
settings and exits. Example: ``python -m trainers.controlled recipes/studies/controlled.yaml learning.seeds=8``.
"""
from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    import json

    from trainers.controlled.config import ControlledConfigError, load_controlled

    args = list(sys.argv[1:] if argv is None else argv)
    show = "--print-config" in args
    args = [a for a in args if a != "--print-config"]
    path = args.pop(0) if args and "=" not in args[0] else None
    try:
        cfg = load_controlled(path, args)
    except ControlledConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if show:
        print(json.dumps(cfg.to_dict(), indent=2))
        return 0
    from trainers.controlled.study import run

    run(cfg, say=lambda msg: print(f"[controlled] {msg}", file=sys.stderr, flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
