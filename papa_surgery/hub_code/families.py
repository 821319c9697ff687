"""The one table of supported architectures, keyed by ``model_type``.

Each entry says where a family's self-attention modules are, how their projections are named, which
PAPA attention style replaces them and which transformers classes the checkpoint's auto classes wrap.
It ships inside every PAPA checkpoint (imports only the standard library), and
``papa_surgery.architectures`` builds the library-side checks on top of it.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field

_COMMON_HEADS = {
    "AutoModel": "Model",
    "AutoModelForMaskedLM": "ForMaskedLM",
    "AutoModelForSequenceClassification": "ForSequenceClassification",
    "AutoModelForTokenClassification": "ForTokenClassification",
    "AutoModelForQuestionAnswering": "ForQuestionAnswering",
    "AutoModelForMultipleChoice": "ForMultipleChoice",
}


@dataclass(frozen=True)
class Family:
    """How one transformers architecture is wired.

    Attributes:
        model_type: the source config's ``model_type``.
        prefix: class-name prefix in transformers (``Bert`` for ``BertModel``...).
        module: the transformers modeling module.
        attention_class: name of the self-attention class whose instances are replaced.
        style: which PAPA attention implementation applies (``interface``: dispatches through
            ``ALL_ATTENTION_FUNCTIONS``; ``mpnet``, ``deberta``, ``deberta-v2``: softmax in the module).
        q, k, v: attribute names of the query, key and value projections.
        out: output projection inside the self-attention module (DistilBERT, MPNet), else ``None``.
        layer_class: the gradient-checkpointed layer class of an override family (``style`` other than
            ``interface``), which carries the batch's slots into recomputation; ``None`` otherwise.
        output_projection: where the output projection that mixes the heads back into the residual
            stream sits, relative to the self-attention module (``../`` = its parent module).
        fused_value_bias: the separate value-bias parameter of a fused query/key/value projection
            (DeBERTa v1's ``in_proj`` holds, per head, its q, k and v rows interleaved), else ``None``.
        needs_output_attentions: the self-attention returns its probabilities only when the model is
            called with ``output_attentions=True`` (calibration and the analyses read them).
        heads_attr: config attribute holding the number of heads per layer.
        layers_attr: config attribute holding the number of layers.
        middle_separators: separator tokens between the two segments of a pair (RoBERTa-style: 2).
        auto_classes: auto class name -> transformers class name.
    """

    model_type: str
    prefix: str
    module: str
    attention_class: str
    style: str
    q: str = "query"
    k: str = "key"
    v: str = "value"
    out: str | None = None
    layer_class: str | None = None
    output_projection: str = "../output.dense"
    fused_value_bias: str | None = None
    needs_output_attentions: bool = False
    heads_attr: str = "num_attention_heads"
    layers_attr: str = "num_hidden_layers"
    middle_separators: int = 1
    auto_classes: dict = field(default_factory=dict)

    @property
    def papa_model_type(self) -> str:
        return f"papa_{self.model_type}"

    @property
    def papa_prefix(self) -> str:
        return f"Papa{self.prefix}"

    def transformers_module(self):
        return importlib.import_module(f"transformers.models.{self.module}.modeling_{self.module}")

    def config_class(self):
        mod = importlib.import_module(f"transformers.models.{self.module}.configuration_{self.module}")
        return getattr(mod, f"{self.prefix}Config")


def _heads(prefix: str, skip: tuple[str, ...] = ()) -> dict:
    return {auto: prefix + suffix for auto, suffix in _COMMON_HEADS.items() if suffix not in skip}


FAMILIES: dict[str, Family] = {
    f.model_type: f
    for f in [
        Family("bert", "Bert", "bert", "BertSelfAttention", "interface", auto_classes=_heads("Bert")),
        Family(
            "roberta",
            "Roberta",
            "roberta",
            "RobertaSelfAttention",
            "interface",
            middle_separators=2,
            auto_classes=_heads("Roberta"),
        ),
        Family(
            "xlm-roberta",
            "XLMRoberta",
            "xlm_roberta",
            "XLMRobertaSelfAttention",
            "interface",
            middle_separators=2,
            auto_classes=_heads("XLMRoberta"),
        ),
        Family("electra", "Electra", "electra", "ElectraSelfAttention", "interface", auto_classes=_heads("Electra")),
        Family(
            "distilbert",
            "DistilBert",
            "distilbert",
            "DistilBertSelfAttention",
            "interface",
            q="q_lin",
            k="k_lin",
            v="v_lin",
            out="out_lin",
            output_projection="out_lin",
            heads_attr="n_heads",
            layers_attr="n_layers",
            auto_classes=_heads("DistilBert"),
        ),
        Family(
            "mpnet",
            "MPNet",
            "mpnet",
            "MPNetSelfAttention",
            "mpnet",
            q="q",
            k="k",
            v="v",
            out="o",
            output_projection="o",
            needs_output_attentions=True,
            middle_separators=2,
            auto_classes=_heads("MPNet"),
        ),
        Family(
            "deberta",
            "Deberta",
            "deberta",
            "DisentangledSelfAttention",
            "deberta",
            q="in_proj",
            k="in_proj",
            v="in_proj",
            layer_class="DebertaLayer",
            fused_value_bias="v_bias",
            needs_output_attentions=True,
            auto_classes=_heads("Deberta", skip=("ForMultipleChoice",)),
        ),
        Family(
            "deberta-v2",
            "DebertaV2",
            "deberta_v2",
            "DisentangledSelfAttention",
            "deberta-v2",
            q="query_proj",
            k="key_proj",
            v="value_proj",
            layer_class="DebertaV2Layer",
            needs_output_attentions=True,
            auto_classes=_heads("DebertaV2"),
        ),
    ]
}

PAPA_MODEL_TYPES = {f.papa_model_type: f for f in FAMILIES.values()}


def family_for(model_type: str) -> Family:
    """The family of a source or PAPA ``model_type``; ValueError listing the supported ones otherwise."""
    if model_type in FAMILIES:
        return FAMILIES[model_type]
    if model_type in PAPA_MODEL_TYPES:
        return PAPA_MODEL_TYPES[model_type]
    raise ValueError(
        f"unsupported architecture model_type={model_type!r}; papa-surgery supports: {', '.join(sorted(FAMILIES))}"
    )
