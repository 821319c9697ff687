"""Downstream fine-tuning experiments: each cell fine-tunes a converted model end to end (``papa-surgery finetune``).

The probe (``papa_surgery.probing``) is the paper's frozen-backbone protocol; this is the practitioner's one:
the family's stock classification head on the whole model, trained with ``transformers.Trainer``, and
the cost of doing so (training and inference speed, peak memory, trainable parameters, checkpoint size).
"""

from ..options import FinetuneOptions
from .train import SavedModel, finetune

__all__ = ["FinetuneOptions", "SavedModel", "finetune"]
