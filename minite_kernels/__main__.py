"""``python -m minite_kernels``: see :mod:`minite_kernels.cli`."""

from __future__ import annotations

import sys

from minite_kernels.cli import main

if __name__ == "__main__":
    sys.exit(main())
