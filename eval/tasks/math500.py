"""MATH-500 (Lightman et al. 2023 split of MATH; report §6.2.2, ref. [12]).

Free-form LaTeX answers (``\\frac{14}{3}``, ``(3, \\frac{\\pi}{2})``) compared by math-verify, gold first.
Default avg@4 (report).
"""
from __future__ import annotations

from eval.task_base import MathTask, register


@register
class MATH500(MathTask):
    name = "math500"
    title = "MATH-500"
    default_samples = 4
    samples_source = "report §6.2.2 (MATH-500 averages four evaluations)"
    hf_path = "HuggingFaceH4/MATH-500"
