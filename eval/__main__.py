"""``python -m eval``: see ``eval.cli``."""
from __future__ import annotations

import sys

from eval.cli import main

sys.exit(main())
