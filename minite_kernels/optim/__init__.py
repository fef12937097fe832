"""Optimizers that cooperate with NVFP4 weight sync (``adamw.py``: AdamW that records each weight's amax)."""

from .adamw import AdamW, adamw_reference_

__all__ = ["AdamW", "adamw_reference_"]
