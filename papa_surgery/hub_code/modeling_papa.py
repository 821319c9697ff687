"""PAPA model classes: every auto class of every supported family, with constant attention heads.

``Papa<Class>`` subclasses the transformers class (``PapaBertModel(BertModel)``,
``PapaRobertaForSequenceClassification(RobertaForSequenceClassification)``, ...). Its ``post_init``
switches the self-attention modules to their PAPA subclass (``papa_attention.py``) according to
``config.papa_constant_heads`` before weights are initialised or loaded, and registers a pre-hook on
the base model that turns each input's ids and attention mask into its slot layout (``slots.py``).

This file ships inside every PAPA checkpoint: it imports only torch, transformers and siblings.
"""

from __future__ import annotations

import inspect
from collections import defaultdict

import torch
from transformers import initialization as init

from .configuration_papa import CONFIG_CLASSES
from .families import FAMILIES, family_for
from .papa_attention import PapaContext, PapaHeadsMixin, convert_module
from .slots import SlotLayout, compute_slots


def heads_by_layer(pairs) -> dict[int, list[int]]:
    """``[[layer, head], ...]`` -> ``{layer: [head, ...]}``."""
    out: dict[int, list[int]] = defaultdict(list)
    for layer, head in pairs or []:
        out[int(layer)].append(int(head))
    return out


def attention_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The self-attention module of every layer, in layer order."""
    family = family_for(model.config.model_type)
    cls = getattr(family.transformers_module(), family.attention_class)
    return [m for m in model.modules() if isinstance(m, cls)]


def apply_papa(
    model: torch.nn.Module,
    constant_heads=None,
    kept_heads=None,
    trainable: bool | None = None,
) -> torch.nn.Module:
    """Switch ``model``'s self-attention modules to PAPA attention, in place.

    Args:
        model: a transformers model of a supported family whose config has the ``papa_*`` fields (or
            plain fields: ``papa_max_length`` is then required via ``config``).
        constant_heads: ``[[layer, head], ...]``; defaults to ``config.papa_constant_heads``.
        kept_heads: ``[[layer, head], ...]`` that keep query/key; defaults to every non-constant head.
            Lambda training passes every head here and in ``constant_heads``.
        trainable: whether constants get gradients; defaults to ``config.papa_trainable_constants``.
    """
    config = model.config
    family = family_for(config.model_type)
    num_heads = getattr(config, family.heads_attr)
    hidden = config.hidden_size if hasattr(config, "hidden_size") else config.dim
    head_dim = getattr(config, "attention_head_size", None) or hidden // num_heads
    const = heads_by_layer(config.papa_constant_heads if constant_heads is None else constant_heads)
    kept = None if kept_heads is None else heads_by_layer(kept_heads)
    if trainable is None:
        trainable = bool(getattr(config, "papa_trainable_constants", False))
    dtype = getattr(torch, getattr(config, "papa_constants_dtype", "float32") or "float32")
    max_length = int(config.papa_max_length)

    base = getattr(model, model.base_model_prefix, model)
    context = base.__dict__.get("papa_context") or PapaContext()
    modules = attention_modules(model)
    for layer, module in enumerate(modules):
        if isinstance(module, PapaHeadsMixin):
            raise ValueError("this model already has PAPA attention; start from the source model")
        convert_module(
            module,
            family,
            layer,
            num_heads,
            head_dim,
            const.get(layer, []),
            max_length,
            dtype,
            trainable,
            context,
            kept_heads=None if kept is None else kept.get(layer, []),
        )
    if "papa_context" not in base.__dict__:
        # The context lives on the base model so deepcopy keeps hook, context and layers together.
        base.__dict__["papa_context"] = context
        base.__dict__["papa_forward_params"] = list(inspect.signature(base.forward).parameters)
        base.register_forward_pre_hook(_set_slot_layout, with_kwargs=True)
    return model


def _set_slot_layout(base: torch.nn.Module, args: tuple, kwargs: dict):
    """Forward pre-hook of the base model: compute the batch's slot layout for the constant heads."""
    params = base.__dict__["papa_forward_params"]

    def arg(name):
        if name in kwargs:
            return kwargs[name]
        if name in params and params.index(name) < len(args):
            return args[params.index(name)]
        return None

    config, context = base.config, base.__dict__["papa_context"]
    requested = arg("output_attentions")
    context.output_attentions = bool(config.output_attentions if requested is None else requested)
    context.layout = None
    if not any(isinstance(m, PapaHeadsMixin) and m.papa_const for m in base.modules()):
        return None
    input_ids, mask, embeds = arg("input_ids"), arg("attention_mask"), arg("inputs_embeds")
    shape = tuple(input_ids.shape) if input_ids is not None else tuple(embeds.shape[:2])
    device = input_ids.device if input_ids is not None else embeds.device
    slots = compute_slots(
        input_ids, mask, int(config.papa_max_length), config.papa_sep_token_id, shape=shape, device=device
    )
    context.layout = SlotLayout(slots, int(config.papa_max_length))
    return None


class PapaPreTrainedMixin:
    """Put in front of a transformers model class: PAPA attention from ``config.papa_constant_heads``."""

    def post_init(self):
        apply_papa(self)
        super().post_init()

    def _init_weights(self, module):
        super()._init_weights(module)
        if isinstance(module, PapaHeadsMixin) and module.papa_constants is not None:
            # Loaded checkpoints overwrite this; a fresh model's constant heads output zero until set.
            init.zeros_(module.papa_constants)


MODEL_CLASSES: dict[str, dict[str, type]] = {}
for _family in FAMILIES.values():
    _module = _family.transformers_module()
    MODEL_CLASSES[_family.model_type] = {}
    for _auto, _name in _family.auto_classes.items():
        _cls = type(
            f"Papa{_name}",
            (PapaPreTrainedMixin, getattr(_module, _name)),
            {"__module__": __name__, "config_class": CONFIG_CLASSES[_family.model_type]},
        )
        MODEL_CLASSES[_family.model_type][_auto] = _cls
        globals()[_cls.__name__] = _cls

__all__ = [c.__name__ for classes in MODEL_CLASSES.values() for c in classes.values()] + ["apply_papa"]
