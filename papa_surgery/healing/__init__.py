"""Healing: label-free training of a converted model toward its source (more than averaging can give).

Read in the order a run uses them: ``sentence`` (a sentence-transformers source's pooling and normalisation),
``objective`` (what is matched: hidden states of every layer, the sentence embedding), ``trainable`` (what trains:
LoRA, every layer weight, or the constants; folded back into a plain PAPA model), ``loop`` (steps, schedule,
processes), ``state`` (the resume file), ``agreement`` (held-out measures), ``run`` (one healing run,
``heal_model``), ``distillation`` (the ``distilled`` kind: the constants only), ``sharpness`` (the ``sharpened``
kind: an exponent per layer, fitted), ``api`` (``papa_surgery.heal``,
which runs the workflow and so is imported from ``papa_surgery`` lazily, not here).
"""

from .distillation import distill
from .run import heal_model
from .sharpness import sharpen

__all__ = ["distill", "heal_model", "sharpen"]
