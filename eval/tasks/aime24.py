"""AIME 2024 (30 problems, integer answers 0-999), Qwen2.5-Math evaluation copy (report §6.2.2, ref. [13]).

Gold answers are zero-padded strings (``"025"``) and are normalised to integers. Default avg@6 (report).
"""
from __future__ import annotations

from eval.task_base import MathTask, register


@register
class AIME24(MathTask):
    name = "aime24"
    title = "AIME24"
    default_samples = 6
    samples_source = "report §6.2.2 (each AIME benchmark averages six evaluations)"
    hf_path = "HuggingFaceH4/aime_2024"
    hf_split = "train"
    integer_answers = True
