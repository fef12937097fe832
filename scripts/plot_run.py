"""Figure-2-style training panels from one or more run directories (``trainers.plots``).

    python scripts/plot_run.py runs/triage_nvfp4 runs/tis_nvfp4 --out docs/triage_vs_tis.png

Panels: reward, entropy, mean |gap|, negative tail depth; thin lines raw, thick lines a ``--smooth``-step
centred moving mean; each run labelled with its recipe. Prints one JSON line with the output path.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from trainers.plots import label_of, plot, read_rows, smooth  # noqa: E402

__all__ = ["label_of", "main", "plot", "read_rows", "smooth"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=pathlib.Path, help="run directories (trainer.output_dir)")
    ap.add_argument("--out", type=pathlib.Path, default=None, help="PNG path (default: <first run>/curves.png)")
    ap.add_argument("--smooth", type=int, default=5, help="centred moving-mean window in steps")
    ap.add_argument("--title", default=None)
    a = ap.parse_args(argv)
    try:
        out = plot(a.runs, a.out or a.runs[0] / "curves.png", a.smooth, a.title)
    except FileNotFoundError as e:
        raise SystemExit(f"error: {e}") from None
    print(json.dumps({"out": str(out), "runs": [str(r) for r in a.runs]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
