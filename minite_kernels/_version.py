"""The package version (one place: ``minite_kernels.__version__`` and the run metadata read it)."""

__version__ = "0.1.0"
