"""AMC 2023 (40 problems), Qwen2.5-Math evaluation copy (report Table 3, ref. [13]).

Gold answers are floats (``27.0``) and are normalised to integers. AMC23 is in the report's Table 3 task set,
not in Table 6-8, and the report states no sample count for it: the default avg@6 is our choice, matching
the other small competition sets (AIME).
"""
from __future__ import annotations

from eval.task_base import MathTask, register


@register
class AMC23(MathTask):
    name = "amc23"
    title = "AMC23"
    default_samples = 6
    samples_source = "not stated in the report; our choice (same as AIME)"
    hf_path = "math-ai/amc23"
    integer_answers = True
