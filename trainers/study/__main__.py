"""``python -m trainers.study``: see ``trainers.study.cli``."""
from __future__ import annotations

import sys

from trainers.study.cli import main

sys.exit(main())
