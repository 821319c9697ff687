"""PAPA model classes: every auto class of a supported family, with constant attention heads.

``Papa<Class>`` subclasses the transformers class (``PapaBertModel(PapaModelMixin, BertModel)``,
``PapaRobertaForSequenceClassification(...)``, ...); classes are built for the checkpoint's own family
only, on first use (``papa_model_class``, or by name through this module's ``__getattr__``, which is what
``auto_map`` and unpickling do).

At construction (``post_init``, before weights are initialised or loaded) the self-attention modules
become PAPA attention according to ``config.papa_constant_heads``. In ``forward`` the model turns the
batch's ids and attention mask into slot indices (``slots.py``) and their plan in the shared compressed slot
space (``slot_plan.py``), once for every layer, and passes it down as an argument: the ``papa_plan`` keyword
for families that dispatch through transformers' attention interface, a call-scoped context for the others
(``overrides.py``). Nothing about a batch is stored on the model between calls.

This file ships inside every PAPA checkpoint: it imports only torch, transformers and siblings.
"""

from __future__ import annotations

import inspect
import itertools
import json
import os
from collections import defaultdict

import torch
from torch import nn

# Every sibling file is imported here by name: transformers before 5.23 copies only the entry file's own
# relative imports into its module cache when loading a checkpoint folder, not theirs.
from .checkpoint_format import format_of
from .compact_constants import COMPACT_PARTS, CompactLayout
from .compat import AttentionResolutionMixin, zeros_unless_loaded
from .configuration_papa import papa_config_class
from .constant_heads import constant_attention  # noqa: F401  (imported for the copy only)
from .dense_slots import DenseSlots  # noqa: F401  (imported for the copy only)
from .families import FAMILIES, family_for
from .heads import PapaHeads
from .overrides import attention_class, layer_class, slot_scope
from .papa_attention import PAPA_PREFIX, register_papa_attention, setup_interface_attention
from .shrink import shrink_linear  # noqa: F401  (imported for the copy only)
from .slot_plan import SlotPlan
from .slots import compute_slots, is_tracing
from .structured_constants import StructuredSlots  # noqa: F401  (imported for the copy only)

register_papa_attention()


def heads_by_layer(pairs) -> dict[int, list[int]]:
    """``[[layer, head], ...]`` -> ``{layer: [head, ...]}``."""
    out: dict[int, list[int]] = defaultdict(list)
    for layer, head in pairs or []:
        out[int(layer)].append(int(head))
    return out


def attention_modules(model: nn.Module) -> list[nn.Module]:
    """The self-attention module of every layer, in layer order (source or PAPA model)."""
    family = family_for(model.config.model_type)
    cls = getattr(family.transformers_module(), family.attention_class)
    return [m for m in model.modules() if isinstance(m, cls)]


def _replace(model: nn.Module, cls: type, make) -> None:
    """Replace every submodule that is exactly ``cls`` by ``make(old)``."""
    for name, old in list(model.named_modules()):
        if type(old) is cls:
            parent_name, _, attr = name.rpartition(".")
            setattr(model.get_submodule(parent_name), attr, make(old))


def _head_dim(config, num_heads: int) -> int:
    hidden = config.hidden_size if hasattr(config, "hidden_size") else config.dim
    return getattr(config, "attention_head_size", None) or hidden // num_heads


def apply_papa(model: nn.Module) -> None:
    """Turn ``model``'s self-attention modules into PAPA attention per its config, in place (construction)."""
    config = model.config
    format_of(config)  # a config built by hand in a format this code cannot read is refused here too
    family = family_for(config.model_type)
    num_heads = int(getattr(config, family.heads_attr))
    head_dim = _head_dim(config, num_heads)
    constant = heads_by_layer(config.papa_constant_heads)
    mixing = bool(config.papa_lambda_mixing)
    dtype = getattr(torch, config.papa_constants_dtype or "float32")
    trainable = bool(config.papa_trainable_constants)
    max_length = int(config.papa_max_length)
    compact = CompactLayout.from_config(config)

    def heads(layer: int) -> PapaHeads:
        kept = list(range(num_heads)) if mixing else None
        return PapaHeads.build(layer, num_heads, head_dim, constant.get(layer, []), kept)

    if family.style == "interface":
        for layer, module in enumerate(attention_modules(model)):
            setup_interface_attention(module, family, heads(layer), max_length, dtype, trainable, compact)
        return
    if family.layer_class is not None:  # checkpointed layers carry the slots into recomputation
        papa_layer = layer_class(family)
        source_layer = getattr(family.transformers_module(), family.layer_class)
        _replace(model, source_layer, lambda old: _rebuilt(papa_layer, old, config))
    layers = itertools.count()
    papa_attention = attention_class(family)

    def make_attention(old: nn.Module) -> nn.Module:
        new = _rebuilt(papa_attention, old, config)
        new.papa_setup(heads(next(layers)), max_length, dtype, trainable, compact)
        return new

    _replace(model, getattr(family.transformers_module(), family.attention_class), make_attention)


def _rebuilt(cls: type, old: nn.Module, config) -> nn.Module:
    """A fresh ``cls(config)`` on ``old``'s device, each parameter in the dtype ``old``'s of that name has, the new
    ones in the dtype most of ``old``'s values have (construction only: weights are loaded later)."""
    # not the first parameter's dtype for all: transformers' DeBERTa v1 makes q_bias/v_bias float32 in a bf16 model,
    # and casting the whole rebuilt layer to it left the checkpoint's layers float32 under dtype=torch.bfloat16
    params = dict(old.named_parameters())
    sizes: dict[torch.dtype, int] = {}
    for p in params.values():
        sizes[p.dtype] = sizes.get(p.dtype, 0) + p.numel()
    with torch.device(next(iter(params.values())).device):
        new = cls(config).to(dtype=max(sizes, key=sizes.get))
    for name, param in new.named_parameters():
        if name in params and param.dtype != params[name].dtype:
            param.data = param.data.to(params[name].dtype)
    return new


class PapaModelMixin(AttentionResolutionMixin):
    """Put in front of a transformers model class: PAPA attention from ``config.papa_constant_heads``."""

    def post_init(self):
        apply_papa(self)
        super().post_init()

    def _init_weights(self, module):
        super()._init_weights(module)
        # transformers' init functions skip tensors a checkpoint already filled (and meta tensors); a fresh
        # model's constant heads output zero until constants are set, and lambda starts at sigmoid(0) = 0.5.
        for name in ("papa_constants", "papa_lambda_logits", *COMPACT_PARTS):
            tensor = getattr(module, name, None)
            if isinstance(tensor, torch.Tensor):
                zeros_unless_loaded(tensor)

    def save_pretrained(self, save_directory, *args, **kwargs):
        """transformers' ``save_pretrained`` (and so ``push_to_hub``), plus ``papa_recipe.json`` when the model
        carries the recipe of its conversion (``papa_surgery.convert`` attaches it as ``papa_recipe``)."""
        out = super().save_pretrained(save_directory, *args, **kwargs)
        recipe = getattr(self, "papa_recipe", None)
        if recipe and kwargs.get("is_main_process", True):
            path = os.path.join(save_directory, "papa_recipe.json")
            with open(path, "w", encoding="utf-8") as f:
                f.write(json.dumps(recipe, indent=2, default=str) + "\n")
        return out

    @property
    def papa_uses_interface(self) -> bool:
        return family_for(self.config.model_type).style == "interface"

    def papa_underlying_attention(self, requested: str | None) -> str | None:
        """The implementation to resolve for ``attn_implementation=requested``: ``"papa_sdpa"`` means ``"sdpa"``."""
        if isinstance(requested, str) and requested.startswith(PAPA_PREFIX):
            return requested[len(PAPA_PREFIX) :]
        return requested

    def papa_wrapped_attention(self, resolved: str) -> str:
        """What the model runs for the resolved implementation: ``attn_implementation="sdpa"`` (or ``"papa_sdpa"``)
        runs the kept heads with sdpa and the constant heads as constant attention; the same for eager and the
        flash implementations (``compat.AttentionResolutionMixin`` calls both)."""
        return PAPA_PREFIX + resolved if self.papa_uses_interface else resolved

    def papa_slots(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """(B, N) slot of every token of a batch (-1 for padding), as ``forward`` computes it.

        Callers that pass ``inputs_embeds`` for sentence pairs compute the slots from the pair's ids and
        pass them as ``papa_slots=``: embeddings alone do not say where the second segment starts.
        """
        return compute_slots(*self._slot_arguments(input_ids, attention_mask, inputs_embeds))

    def papa_plan(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> SlotPlan:
        """The batch's :class:`~slot_plan.SlotPlan` (slots and their compressed layout), as ``forward`` builds it."""
        return SlotPlan.from_tokens(*self._slot_arguments(input_ids, attention_mask, inputs_embeds))

    def _slot_arguments(self, input_ids, attention_mask, inputs_embeds) -> tuple:
        config = self.config
        # Multiple-choice heads take (B, C, N) inputs and run the encoder on (B*C, N).
        input_ids = input_ids.reshape(-1, input_ids.shape[-1]) if input_ids is not None else None
        if attention_mask is not None:
            attention_mask = attention_mask.reshape(-1, attention_mask.shape[-1])
        shape = device = None
        if input_ids is None and inputs_embeds is not None:  # (..., N, hidden)
            shape, device = (inputs_embeds[..., 0, 0].numel(), inputs_embeds.shape[-2]), inputs_embeds.device
        sep = config.papa_sep_token_id if input_ids is not None else None
        return input_ids, attention_mask, int(config.papa_max_length), sep, shape, device

    def forward(self, papa_slots: torch.Tensor | None = None, **inputs):
        """The source class's ``forward``, with the batch's slots passed down to the constant heads.

        ``papa_slots`` (B, N) overrides the slots computed from ``input_ids`` and ``attention_mask``.
        """
        return self._with_slots(super().forward, papa_slots, inputs)

    def papa_base_forward(self, papa_slots: torch.Tensor | None = None, **inputs):
        """The encoder under the task head (``self.base_model``) with the batch's slots: its outputs without
        the head's compute (a probe reads the hidden states of every layer)."""
        base = self.base_model
        run = super().forward if base is self else base.forward
        return self._with_slots(run, papa_slots, inputs)

    def _with_slots(self, run, papa_slots: torch.Tensor | None, inputs: dict):
        _refuse_task_adapters(inputs)
        if not self.config.papa_constant_heads:
            return run(**inputs)
        if papa_slots is None:
            input_ids, embeds = inputs.get("input_ids"), inputs.get("inputs_embeds")
            if input_ids is None and embeds is None:
                raise ValueError("pass input_ids or inputs_embeds to a PAPA model")
            if input_ids is None:
                _refuse_embedded_pairs(inputs.get("token_type_ids"), inputs.get("attention_mask"))
            plan = self.papa_plan(input_ids, inputs.get("attention_mask"), embeds)
        else:
            plan = SlotPlan.from_slots(papa_slots.reshape(-1, papa_slots.shape[-1]), int(self.config.papa_max_length))
        if self.papa_uses_interface:
            return run(**inputs, papa_plan=plan)
        with slot_scope(plan):
            return run(**inputs)


def _refuse_task_adapters(inputs: dict) -> None:
    """Jina-v3's remote code picks a task LoRA with ``task=``/``adapter_mask=``; transformers' class has none.

    transformers would pass the unknown keyword on to the attention function, which ignores it: refuse
    rather than silently encode without the task adapter.
    """
    given = sorted(k for k in ("task", "task_id", "adapter_mask") if inputs.get(k) is not None)
    if given:
        raise ValueError(
            f"{given[0]}= selects a task adapter, which transformers' native classes (and so PAPA checkpoints) do "
            "not have: encode without it, with the instruction prefix of the task in the text; a task LoRA made "
            "for the source's full query/key projections does not fit a PAPA model's shrunk ones"
        )


def _refuse_embedded_pairs(token_type_ids, attention_mask) -> None:
    """Embeddings do not say where a pair's second segment starts: refuse a pair rather than misplace it."""
    if token_type_ids is None or is_tracing():
        return
    second = token_type_ids.bool() if attention_mask is None else token_type_ids.bool() & attention_mask.bool()
    if bool(second.any()):
        raise ValueError(
            "a sentence pair given as inputs_embeds cannot be placed in the constant attention's slot layout "
            "(its second segment would be read as part of the first): pass input_ids, or pass "
            "papa_slots=model.papa_slots(input_ids, attention_mask) with the embeddings"
        )


def _forward_for(source: type):
    """``PapaModelMixin.forward`` under the source class's signature (plus ``papa_slots``).

    Positional arguments are named by the source's own signature (``RobertaForMultipleChoice`` takes
    ``token_type_ids`` second, ``BertModel`` ``attention_mask``). Trainer, pipelines and peft read
    ``inspect.signature(model.forward)`` to decide which inputs a model takes: they see the source's.
    """
    signature = inspect.signature(source.forward)
    params = list(signature.parameters.values())[1:]  # without self
    positional = [p.name for p in params if p.kind == inspect.Parameter.POSITIONAL_OR_KEYWORD]

    def forward(self, *args, papa_slots=None, **kwargs):
        if len(args) > len(positional):
            raise TypeError(f"{type(self).__name__}.forward takes at most {len(positional)} positional arguments")
        for name, value in zip(positional, args, strict=False):
            if name in kwargs:
                raise TypeError(f"{type(self).__name__}.forward got multiple values for argument {name!r}")
            kwargs[name] = value
        return PapaModelMixin.forward(self, papa_slots=papa_slots, **kwargs)

    extra = inspect.Parameter("papa_slots", inspect.Parameter.KEYWORD_ONLY, default=None)
    at = next((i for i, p in enumerate(params) if p.kind == inspect.Parameter.VAR_KEYWORD), len(params))
    forward.__signature__ = signature.replace(
        parameters=[*list(signature.parameters.values())[:1], *params[:at], extra, *params[at:]]
    )
    forward.__doc__ = PapaModelMixin.forward.__doc__
    return forward


def papa_model_class(model_type: str, auto_class: str = "AutoModel") -> type:
    """``Papa<Class>`` for a family's auto class (``AutoModel``, ``AutoModelForMaskedLM``, ...), built on first use."""
    family = family_for(model_type)
    if auto_class not in family.auto_classes:
        raise ValueError(
            f"{family.model_type} has no PAPA class for {auto_class}; it has {sorted(family.auto_classes)}"
        )
    source_name = family.auto_classes[auto_class]
    name = f"Papa{source_name}"
    if name not in globals():
        source = getattr(family.transformers_module(), source_name)
        attrs = {
            "__module__": __name__,
            "config_class": papa_config_class(family.model_type),
            "forward": _forward_for(source),
        }
        cls = type(name, (PapaModelMixin, source), attrs)
        # save_pretrained / push_to_hub of any PAPA model (converted or fine-tuned) then writes this code
        # next to the weights and names the class in the config's auto_map.
        cls.register_for_auto_class(auto_class)
        globals()[name] = cls
    return globals()[name]


def __getattr__(name: str):
    # ``auto_map`` and unpickling look model classes up by name: build them on demand.
    for family in FAMILIES.values():
        for auto, source_name in family.auto_classes.items():
            if name == f"Papa{source_name}":
                return papa_model_class(family.model_type, auto)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
