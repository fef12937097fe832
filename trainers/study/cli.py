"""The command line, ``python -m trainers.study`` (:func:`main`); its help is the package docstring."""
from __future__ import annotations

import json
import signal
import sys

from trainers.study import __doc__  # the help main() prints: the package docstring
from trainers.study.config import StudyError, load_study
from trainers.study.runner import run_study
from trainers.study.tables import table, where


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if args else 2
    train_seconds = None
    if "--train-seconds" in args:
        i = args.index("--train-seconds")
        try:
            train_seconds = float(args[i + 1])
        except (IndexError, ValueError):
            print("study error: --train-seconds needs a number of seconds", file=sys.stderr)
            return 2
        del args[i:i + 2]
    try:
        cfg = load_study(args[0], args[1:])
    except StudyError as e:
        print(f"study error: {e}", file=sys.stderr)
        return 2
    # a SIGTERM (timeout, a scheduler) unwinds like Ctrl-C, so the runs this study started are stopped with it
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    summary = run_study(cfg, say=lambda m: print(f"[study] {m}", flush=True), train_seconds=train_seconds)
    print(table(summary))
    print(where(cfg))
    print(json.dumps({"summary": str(cfg.root / "summary.json"), "failed": summary["failed"],
                      "stopped": summary["stopped"]}))
    return 1 if summary["failed"] else 0
