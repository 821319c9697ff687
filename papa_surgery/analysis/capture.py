"""Hooks that hand each layer's self-attention input x (B, N, D) and probabilities A (B, H, N, N) to a callback.

Like ``calibrate.py``: a forward hook on every self-attention module reads A from its output (eager
attention; MPNet and DeBERTa return A only when asked with ``output_attentions=True``), and a forward
pre-hook reads the hidden state entering it, which is the value input x.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager

import torch

from ..hub_code.modeling_papa import attention_modules
from ..models.families import get_family


def needs_output_attentions(model) -> bool:
    """Whether the family's self-attention returns its probabilities only with ``output_attentions=True``."""
    return get_family(model).needs_output_attentions


@contextmanager
def recording(model, callback: Callable[[int, torch.Tensor, torch.Tensor], None]):
    """While active, every forward pass calls ``callback(layer, x, probs)`` once per layer.

    The model runs with eager attention (restored on exit). ``x`` is (B, N, D), ``probs`` (B, H, N, N).
    """
    modules = attention_modules(model)
    inputs: dict[int, torch.Tensor] = {}

    def pre(layer):
        def hook(_module, args, kwargs):
            inputs[layer] = args[0] if args else kwargs["hidden_states"]

        return hook

    def post(layer):
        def hook(_module, _args, out):
            probs = out[1] if isinstance(out, tuple) and len(out) > 1 else None
            if probs is None:
                raise RuntimeError("the self-attention module returned no probabilities; run with eager attention")
            callback(layer, inputs.pop(layer), probs)

        return hook

    previous = model.config._attn_implementation
    model.set_attn_implementation("eager")
    handles = []
    try:
        for layer, m in enumerate(modules):
            handles.append(m.register_forward_pre_hook(pre(layer), with_kwargs=True))
            handles.append(m.register_forward_hook(post(layer)))
        yield
    finally:
        for h in handles:
            h.remove()
        model.set_attn_implementation(previous)
