"""The sections of ``scripts/bench_kernels.py``, one file per concern; ``common.py`` holds what they share."""
