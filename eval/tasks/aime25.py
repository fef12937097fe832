"""AIME 2025 I+II (30 problems, integer answers), QwQ evaluation copy (report §6.2.2, ref. [13]).

The bundled rows carry the problem with the boxed-answer instruction already appended (``prompt``); the
suffix is stripped and re-added so every math task uses one template. Default avg@6 (report).
"""
from __future__ import annotations

from eval.task_base import MathTask, register


@register
class AIME25(MathTask):
    name = "aime25"
    title = "AIME25"
    default_samples = 6
    samples_source = "report §6.2.2 (each AIME benchmark averages six evaluations)"
    hf_path = "math-ai/aime25"
    integer_answers = True
