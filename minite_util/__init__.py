"""minite_util: the small helpers every package of the project shares, at the bottom of the layer order.

- ``minite_util.fileio``: atomic writes (every file the project writes), file checksums, jsonl reading with
  one-line errors;
- ``minite_util.choices``: "did you mean" for a bad name, behind every error that lists the valid choices.

Standard library only: it imports nothing of the project (``tests/test_layering.py``) and no third-party package.
"""
