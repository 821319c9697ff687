"""Probing (paper 3.3): score a frozen encoder on a labelled task with the paper's probe.

``features`` (hidden states of every layer, cached), ``heads`` (the probe heads), ``train`` (the training
loop, shared with the lambda ranking), ``run`` (:func:`probe`, one cell), ``mlm`` (masked-LM perplexity),
and ``labeled`` (constants trained with the probe, paper Table 1). A sweep cell probes through
:class:`papa_surgery.experiments.jobs.ProbeJob`.

    from papa_surgery.probing import probe
    result = probe(model, tokenizer, "sst2", data_dir="../shared/data", max_train_examples=2000)
"""

from .heads import SentenceProbe, TokenProbe, build_head
from .run import FeatureCache, probe, slot_count

__all__ = ["FeatureCache", "SentenceProbe", "TokenProbe", "build_head", "probe", "slot_count"]
