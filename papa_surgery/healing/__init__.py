"""Healing: label-free training of a converted model toward its source (more than averaging can give).

``distill``: the ``distilled`` kind, the heads' constant matrices trained to reproduce the source's hidden
states (every other weight frozen).
"""

from .distillation import distill

__all__ = ["distill"]
