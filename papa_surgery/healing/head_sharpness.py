"""An exponent per constant head, fitted by gradient descent (``sharpen(..., search="per-head")``).

Why: the per-layer search (:mod:`.sharpness`) gives every constant head of a layer one exponent, but the heads of a
layer are not alike: some averaged heads were sharp in every input (a head on the previous token) and need little
more, some were sharp on different slots in each input and stay flat however sharpened. Fitting one exponent per
head by trying values would cost a forward pass per head and value; by gradient it costs 64 forward and backward
passes of one batch. On all-mpnet-base-v2's long documents (L=512, fraction 1) it left the model closer to its source
than the per-layer walk, for a fit costing one calibration where the walk's cost 2.4
(``benchmarks/results/bench_kinds-mpnet-documents-per-head.txt``).

How: each constant head's matrix is ``exp(p * log C)`` (C the starting average; each row divided by its largest
value, and renormalised at use as every constant's), with ``p = exp(s)`` (positive by construction) and ``s``
starting at 0, the average. Adam takes ``steps`` steps on ``s`` only (every weight frozen), one batch of the fitting
text per step in turn, minimising healing's ``layers`` objective (each layer's hidden-state error relative to the
source's variance, averaged). The result is again one constant matrix per head, stored and run as any other.
"""

from __future__ import annotations

import warnings

import torch

from ..registry import SHARPEN_STEP_EXAMPLES as STEP_EXAMPLES
from ..registry import SHARPEN_STEP_TOKENS as STEP_TOKENS
from .objective import hidden_error

__all__ = ["STEP_EXAMPLES", "STEP_TOKENS", "fit_head_exponents", "step_batches"]


def step_batches(batches, tokens: int = STEP_TOKENS, examples: int = STEP_EXAMPLES):
    """``batches`` (``[(inputs, the source's hidden states), ...]``) cut into steps, in the same order: each batch
    into runs of ``examples`` examples, each run without the trailing padding columns none of its examples uses, and
    cut again where it holds more than ``tokens`` tokens (at least one example a step).

    Why runs of ``examples`` first: the fitting text is sorted by length, so a batch of 32 cut in two is the two
    batches of 16, and (padded on the right) the steps and the fit are the same for any batch size that is a
    multiple of ``examples``; a step's size then follows its own examples' length, not its batch's longest. Why
    trailing columns only: leading padding (a tokenizer padding on the left) moves the positions of the real tokens
    in models that number positions by column (BERT), so it stays as the source's hidden states were computed with.
    The source's hidden states are cut as views, not copied; the inputs (a few integers a token) are made
    contiguous, as some models ``view`` them."""
    out = []
    for inputs, targets in batches:
        mask = inputs["attention_mask"]  # (B, T)
        for first in range(0, len(mask), examples):
            run = min(len(mask), first + examples)
            step = max(1, tokens // _width(mask[first:run]))
            for i in range(first, run, step):
                end = min(run, i + step)
                width = _width(mask[i:end])
                cut = {k: v[i:end, :width].contiguous() for k, v in inputs.items()}  # (b, T') each
                out.append((cut, tuple(t[i:end, :width] for t in targets)))  # (b, T', D) each
    return out


def _width(mask: torch.Tensor) -> int:
    """Columns of ``mask`` ((b, T)) up to its last real token (all T where it holds none)."""
    used = mask.any(0).nonzero()  # (n, 1)
    return int(used.max()) + 1 if len(used) else mask.shape[1]


def fit_head_exponents(papa, modules: dict, starts: dict, batches, *, steps: int, lr: float, progress: bool):
    """Each constant head's exponent, fitted to the source (module docstring).

    Args:
        papa: the converted model (dense constants; nothing of it is trained: its constants are put back as found).
        modules: ``{layer: attention module}`` of the layers with constant heads.
        starts: ``{layer: (Hc, L, L) starting constants}`` of those modules (their heads in ascending order).
        batches: ``[(inputs, the source's hidden states), ...]`` of the fitting text, one per step (see
            :func:`step_batches`).
        steps: Adam steps (one batch each, the batches in turn: shortest examples first).
        lr: Adam's learning rate on ``log p``.
        progress: show a progress bar over the steps.

    Returns:
        ``({layer: [p of each constant head, ascending head order]}, [loss of each step])``.
    """
    from tqdm.auto import tqdm

    # (Hc, L, L): 1 where C > 0, 0 in an empty cell (it stays 0 at any p); log C, 0 in an empty cell
    filled = {layer: (start > 0).float() for layer, start in starts.items()}
    logs = {layer: torch.where(start > 0, start.double(), 1.0).log().float() for layer, start in starts.items()}
    scales = {layer: torch.zeros(len(log), device=log.device, requires_grad=True) for layer, log in logs.items()}
    found = {layer: module.papa_constants for layer, module in modules.items()}

    def sharpened(module, args, layer):
        p = scales[layer].exp()  # (Hc,)
        logits = p[:, None, None] * logs[layer]  # (Hc, L, L)
        # each row divided by its largest value (the scale is free: rows are renormalised at use): a large p would
        # otherwise underflow a row to zeros in float32; a new tensor, so the runtime re-prepares it
        module.papa_constants = (logits - logits.amax(-1, keepdim=True).detach()).exp() * filled[layer]

    hooks = [
        module.register_forward_pre_hook(lambda m, a, layer=layer: sharpened(m, a, layer))
        for layer, module in modules.items()
    ]
    optimizer = torch.optim.Adam(scales.values(), lr=lr)
    if steps < len(batches):
        warnings.warn(
            f"per-head sharpness: {steps} steps visit {steps} of the {len(batches)} batches of the fitting text (the "
            "longest examples are left out); fit on fewer or shorter examples, or raise steps",
            stacklevel=3,
        )
    losses = []
    try:
        with torch.enable_grad():
            for step in tqdm(range(steps), desc="sharpness", unit="step", disable=not progress):
                inputs, targets = batches[step % len(batches)]
                outputs = papa(**inputs, output_hidden_states=True).hidden_states
                loss = hidden_error(outputs, targets, inputs["attention_mask"], "layers")
                optimizer.zero_grad()
                loss.backward(inputs=list(scales.values()))  # the exponents only: no weight's grad
                if step == 0 and any(s.grad is None for s in scales.values()):  # a hook that never ran
                    raise RuntimeError("per-head sharpness: the constants of some layers were never used")
                optimizer.step()
                losses.append(float(loss.detach()))
    finally:
        for hook in hooks:
            hook.remove()
        for layer, module in modules.items():
            module.papa_constants = found[layer]
    return {layer: [float(v) for v in s.detach().exp()] for layer, s in scales.items()}, losses
