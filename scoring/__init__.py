"""Answer scoring shared by the RL rewards (``trainers.rewards``) and ``python -m eval``: one definition of what
counts as a correct answer, so a reward during training and a score at evaluation can never disagree.

- ``scoring.math``: final-answer extraction (``\\boxed{}``, GSM8K's ``####``, the last number) and verification
  (exact numbers, then math-verify in subprocess workers).
"""
