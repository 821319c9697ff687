"""The sentence embedding a sentence-transformers model makes from its encoder's hidden states.

A sentence-transformers folder (``modules.json``) runs the encoder, then ``Pooling`` (mean, CLS, max, ...), maybe
``Dense`` projections, then ``Normalize``. Healing matches the converted model's embedding to the source's through
the same steps, so the term it optimises is what ``SentenceTransformer(...).encode`` returns. The steps are read from
the folder's JSON and safetensors files (sentence-transformers itself is not needed); a module this file does not
know makes :func:`sentence_pipeline` return ``None`` with the reason, and the healing objective then says so.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

# sentence-transformers' pooling modes, in its order; ``pooling_mode_<legacy>: true`` in configs written before v6
POOLING_MODES = ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")
LEGACY_MODES = {
    "cls_token": "cls",
    "max_tokens": "max",
    "mean_tokens": "mean",
    "mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "weightedmean_tokens": "weightedmean",
    "lasttoken": "lasttoken",
}
ACTIVATIONS = {
    "Identity": torch.nn.Identity,
    "Tanh": torch.nn.Tanh,
    "ReLU": torch.nn.ReLU,
    "GELU": torch.nn.GELU,
    "Sigmoid": torch.nn.Sigmoid,
}


@dataclass(frozen=True)
class SentencePipeline:
    """Pooling (concatenated modes, in sentence-transformers' order), Dense layers, normalisation.

    Attributes:
        modes: pooling modes, a subset of ``POOLING_MODES`` in that order.
        dense: ``(weight, bias or None, activation name)`` per Dense module, in order.
        normalize: unit-length output (a ``Normalize`` module).
        source: the folder the pipeline was read from (for messages).
    """

    modes: tuple[str, ...]
    dense: tuple[tuple[torch.Tensor, torch.Tensor | None, str], ...] = field(default=(), repr=False)
    normalize: bool = False
    source: str = ""

    def __call__(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """(B, E) embeddings of (B, N, D) last hidden states with their (B, N) attention mask (either padding side)."""
        m = mask.to(hidden.dtype).unsqueeze(-1)  # (B, N, 1)
        lengths = m.sum(1).clamp_min(1e-9)  # (B, 1)
        first = mask.long().argmax(1)  # (B,) the first real token
        rows = torch.arange(hidden.shape[0], device=hidden.device)
        parts = []
        for mode in self.modes:
            if mode == "cls":
                parts.append(hidden[rows, first])
            elif mode == "max":
                parts.append(hidden.masked_fill(m == 0, float("-inf")).amax(1))
            elif mode == "mean":
                parts.append((hidden * m).sum(1) / lengths)
            elif mode == "mean_sqrt_len_tokens":
                parts.append((hidden * m).sum(1) / lengths.sqrt())
            elif mode == "weightedmean":  # weights 1, 2, ... from the first real token
                positions = torch.arange(1, m.shape[1] + 1, device=m.device, dtype=m.dtype).view(1, -1, 1)
                weights = m * (positions - first.view(-1, 1, 1).to(m.dtype))
                parts.append((hidden * weights).sum(1) / weights.sum(1).clamp_min(1e-9))
            else:  # lasttoken: the last real token, either padding side
                last = mask.shape[1] - 1 - mask.long().flip(1).argmax(1)  # (B,)
                parts.append(hidden[rows, last])
        out = torch.cat(parts, dim=-1) if len(parts) > 1 else parts[0]  # (B, E)
        for weight, bias, activation in self.dense:
            out = ACTIVATIONS[activation]()(torch.nn.functional.linear(out, weight.to(out), _to(bias, out)))
        return torch.nn.functional.normalize(out, dim=-1) if self.normalize else out

    def describe(self) -> str:
        """``mean pooling, normalised``: the pipeline in words (recipes and cards)."""
        words = [" + ".join(m.removesuffix("_tokens") for m in self.modes) + " pooling"]
        words += [f"dense {tuple(w.shape[::-1])} {act}" for w, _, act in self.dense]
        return ", ".join(words + (["normalised"] if self.normalize else []))


def _to(tensor: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor | None:
    return None if tensor is None else tensor.to(like)


def sentence_pipeline(source) -> tuple[SentencePipeline | None, str]:
    """The sentence-transformers pipeline of a model folder or Hub id, and why not when there is none.

    Returns ``(pipeline, "")`` or ``(None, reason)``: not a sentence-transformers model, or a module that is not
    Pooling, Dense or Normalize.
    """
    from ..conversion.st_files import sentence_transformers_folder

    folder = sentence_transformers_folder(source) if source else None
    if folder is None:
        return None, f"{source or 'the model'} is not a sentence-transformers model (no modules.json)"
    modules = json.loads((folder / "modules.json").read_text(encoding="utf-8"))
    modes: tuple[str, ...] = ()
    dense, normalize = [], False
    for module in sorted(modules, key=lambda m: int(m.get("idx", 0)))[1:]:  # the first is the encoder
        ref = str(module.get("type", ""))  # the source's own code (not sentence_transformers.*) is never run here
        kind = ref.rsplit(".", 1)[-1] if ref.startswith("sentence_transformers.") else ref
        path = folder / (module.get("path") or "")
        if kind == "Pooling":
            modes = _pooling_modes(_json(path / "config.json"))
            if not modes:
                return None, f"{path / 'config.json'} names no pooling mode"
        elif kind == "Dense":
            layer = _dense(path)
            if isinstance(layer, str):
                return None, layer
            dense.append(layer)
        elif kind == "Normalize":
            normalize = True
        else:
            return None, f"{folder} has a {kind} module, which healing cannot reproduce (Pooling, Dense, Normalize)"
    if not modes:
        return None, f"{folder} has no Pooling module"
    return SentencePipeline(modes, tuple(dense), normalize, str(source)), ""


def _pooling_modes(config: dict) -> tuple[str, ...]:
    """The pooling modes of a Pooling config: ``pooling_mode`` (a name or a list; sentence-transformers 6) or the
    older ``pooling_mode_<mode>: true`` keys, in sentence-transformers' order."""
    given = config.get("pooling_mode")
    if given is None:
        given = [new for old, new in LEGACY_MODES.items() if config.get(f"pooling_mode_{old}")]
    given = [given] if isinstance(given, str) else list(given)
    return tuple(mode for mode in POOLING_MODES if mode in given)


def _json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def _dense(path: Path):
    """``(weight, bias, activation)`` of a Dense module folder, or why it cannot be read."""
    from safetensors.torch import load_file

    config = _json(path / "config.json")
    activation = str(config.get("activation_function", "torch.nn.modules.linear.Identity")).rsplit(".", 1)[-1]
    if activation not in ACTIVATIONS:
        return f"{path}: activation {activation} is not one of {', '.join(ACTIVATIONS)}"
    weights = path / "model.safetensors"
    if not weights.is_file():
        return f"{path} has no model.safetensors (pickled weights are not read)"
    state = load_file(str(weights))
    return state["linear.weight"], state.get("linear.bias"), activation
