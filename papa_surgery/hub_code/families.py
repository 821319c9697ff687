"""The one table of supported architectures, keyed by ``model_type``.

Each entry says where a family's self-attention modules are, how their projections are named, which
PAPA attention style replaces them and which transformers classes the checkpoint's auto classes wrap.
It ships inside every PAPA checkpoint (imports only the standard library), and
``papa_surgery.models.families`` builds the library-side checks on top of it.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import re
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
        min_transformers: the oldest transformers release (major, minor) whose modeling module this
            family's PAPA attention works with (the family is missing, or dispatches attention outside the
            attention interface, before it).
        fused_qkv: ``q``, ``k`` and ``v`` name one fused projection with rows ``[Q; K; V]`` (ModernBERT's
            ``Wqkv``), which the family's forward splits into three equal blocks of every head.
        rotary: the function of the family's modeling module that rotates query and key (a fused family's PAPA
            forward applies it to the kept heads only), else ``None``.
        kv_heads_attr: config attribute holding the number of key/value heads of grouped-query
            attention (EuroBERT), else ``None``.
        window_attr: config attribute holding the half width w of a local layer's sliding window
            (a token attends to tokens at distance <= w), for families with local layers, else ``None``.
        notes: what PAPA does differently for this family (README table, model card).
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
    min_transformers: tuple[int, int] = (5, 0)
    fused_qkv: bool = False
    rotary: str | None = None
    kv_heads_attr: str | None = None
    window_attr: str | None = None
    notes: str = ""

    @property
    def papa_model_type(self) -> str:
        return f"papa_{self.model_type}"

    @property
    def papa_prefix(self) -> str:
        return f"Papa{self.prefix}"

    def check_transformers(self, version: str | None = None) -> None:
        """ImportError naming the release needed when the installed transformers is older than the family's."""
        version = version or importlib.metadata.version("transformers")
        match = re.match(r"(\d+)\.(\d+)", version)
        found = tuple(int(x) for x in match.groups()) if match else (0, 0)
        if found < self.min_transformers:
            need = ".".join(map(str, self.min_transformers))
            raise ImportError(
                f"{self.model_type} models need transformers>={need} for PAPA attention, but transformers "
                f'{version} is installed: pip install "transformers>={need}"'
            )

    def transformers_module(self):
        self.check_transformers()
        return importlib.import_module(f"transformers.models.{self.module}.modeling_{self.module}")

    def config_class(self):
        self.check_transformers()
        mod = importlib.import_module(f"transformers.models.{self.module}.configuration_{self.module}")
        return getattr(mod, f"{self.prefix}Config")


def _heads(prefix: str, skip: tuple[str, ...] = ()) -> dict:
    return {auto: prefix + suffix for auto, suffix in _COMMON_HEADS.items() if suffix not in skip}


# The modern encoders: rotary positions, separate or fused projections named like decoder LLMs'. They were
# written and tested against transformers 5.23 (5.0 has none of them but ModernBERT, which there still runs
# its own attention functions instead of the attention interface).
_MODERN = (5, 23)
_ROTARY = "rotary positions on the kept heads only"
_LLM_NAMES = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "out": "o_proj", "output_projection": "o_proj"}


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
        Family(
            "modernbert",
            "ModernBert",
            "modernbert",
            "ModernBertAttention",
            "interface",
            q="Wqkv",
            k="Wqkv",
            v="Wqkv",
            out="Wo",
            output_projection="Wo",
            fused_qkv=True,
            rotary="apply_rotary_pos_emb",
            window_attr="sliding_window",
            auto_classes=_heads("ModernBert"),
            min_transformers=_MODERN,
            notes=(
                f"{_ROTARY}; fused Wqkv keeps the kept heads' Q/K rows (a layer with constant heads runs a PAPA "
                "forward that splits, rotates and attends with those only); a local layer's constants are masked to "
                "its sliding window at use"
            ),
        ),
        Family(
            "gte",
            "Gte",
            "gte",
            "GteAttention",
            "interface",
            **_LLM_NAMES,
            auto_classes=_heads("Gte", skip=("ForQuestionAnswering", "ForMultipleChoice")),
            min_transformers=_MODERN,
            notes=_ROTARY,
        ),
        Family(
            "nomic_bert",
            "NomicBert",
            "nomic_bert",
            "NomicBertAttention",
            "interface",
            **_LLM_NAMES,
            auto_classes=_heads("NomicBert", skip=("ForQuestionAnswering", "ForMultipleChoice")),
            min_transformers=_MODERN,
            notes=_ROTARY,
        ),
        Family(
            "eurobert",
            "EuroBert",
            "eurobert",
            "EuroBertAttention",
            "interface",
            **_LLM_NAMES,
            kv_heads_attr="num_key_value_heads",
            auto_classes=_heads("EuroBert", skip=("ForQuestionAnswering", "ForMultipleChoice")),
            min_transformers=_MODERN,
            notes=(
                f"{_ROTARY}; grouped-query attention: a key head is removed only when every query head of "
                "its group is constant, value heads all stay (constant heads read them)"
            ),
        ),
        Family(
            "jina_embeddings_v3",
            "JinaEmbeddingsV3",
            "jina_embeddings_v3",
            "JinaEmbeddingsV3Attention",
            "interface",
            **_LLM_NAMES,
            middle_separators=2,
            auto_classes=_heads("JinaEmbeddingsV3", skip=("ForMultipleChoice",)),
            min_transformers=_MODERN,
            notes=(
                f"{_ROTARY}; transformers' native class has no task adapters: `task=` is refused (a task "
                "LoRA made for the source's full Q/K does not fit the shrunk projections)"
            ),
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
