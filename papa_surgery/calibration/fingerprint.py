"""Which model constants belong to: the config fields and attention weights recorded at calibration, and the check
shared by :class:`~papa_surgery.calibration.constants.Constants` and ``StructuredConstants``."""

from __future__ import annotations

import torch


class Compatibility:
    """``check_compatible``, shared by :class:`Constants` and ``StructuredConstants`` (it reads ``num_layers``,
    ``num_heads`` and ``metadata``)."""

    def check_compatible(self, config, source: str | None = None, model=None) -> None:
        """ValueError unless these constants fit a model with ``config``.

        Compared by identity, not by name: the fingerprint recorded at calibration (the config fields that
        matter and, given ``model``, a hash of its attention weights) must match. Constants without a
        fingerprint (older files, data-free kinds) fall back to the layer/head shape and the source's name.
        """
        from ..models.families import num_heads_layers

        heads, layers = num_heads_layers(config)
        if (layers, heads) != (self.num_layers, self.num_heads):
            raise ValueError(
                f"constants have {self.num_layers} layers x {self.num_heads} heads but the model has "
                f"{layers} x {heads}; calibrate constants for this model"
            )
        made_for = self.metadata.get("source_model")
        recorded = self.metadata.get("fingerprint")
        if isinstance(recorded, dict) and recorded:
            fix = "calibrate constants for this model (papa-surgery calibrate MODEL ...)"
            mine = config_fingerprint(config)
            for key, value in mine.items():
                if recorded.get(key) is not None and value is not None and recorded[key] != value:
                    raise ValueError(
                        f"constants were calibrated on {made_for!r} with {key}={recorded[key]!r}, but this model "
                        f"({source or config.model_type}) has {key}={value!r}; {fix}"
                    )
            if model is not None and recorded.get("attention_sha256"):
                ours = model_fingerprint(model)
                dtypes = {recorded.get("dtype"), ours["dtype"]}
                if (len(dtypes) == 1 or "float16" not in dtypes) and ours["attention_sha256"] != recorded[
                    "attention_sha256"
                ]:
                    raise ValueError(
                        f"constants were calibrated on {made_for!r}, a model with other attention weights than "
                        f"{source or 'this model'} (same architecture, different checkpoint); {fix}"
                    )
            return
        if source and made_for and _model_name(made_for) != _model_name(source):
            raise ValueError(
                f"constants were calibrated on {made_for!r}, not {source!r}; calibrate for this model or pass "
                f"the matching source"
            )


def _model_name(name: str) -> str:
    """Compare sources by their last path component, so a local copy of a Hub model still matches."""
    return str(name).rstrip("/").split("/")[-1] if name else name


def config_fingerprint(config) -> dict:
    """The config fields that make constants fit a model: family, sizes, vocabulary and position limits."""
    from ..models.families import num_heads_layers

    heads, layers = num_heads_layers(config)
    model_type = str(getattr(config, "model_type", "")).removeprefix("papa_")
    return {
        "model_type": model_type,
        "num_layers": layers,
        "num_heads": heads,
        "hidden_size": getattr(config, "hidden_size", None) or getattr(config, "dim", None),
        "vocab_size": getattr(config, "vocab_size", None),
        "max_position_embeddings": getattr(config, "max_position_embeddings", None),
    }


def model_fingerprint(model) -> dict:
    """``config_fingerprint`` plus a SHA-256 of every attention module's weights (rounded to bfloat16, so a
    model loaded in bf16 matches its fp32 original), recorded in calibrated constants' metadata."""
    import hashlib

    from ..hub_code.modeling_papa import attention_modules

    digest = hashlib.sha256()
    dtype = None
    for layer, module in enumerate(attention_modules(model)):
        for name, param in sorted(module.named_parameters()):
            if name.startswith("papa_") or ".papa_" in name:
                continue
            dtype = dtype or str(param.dtype).replace("torch.", "")
            data = param.detach().to("cpu", torch.bfloat16).contiguous().view(torch.int16)
            digest.update(f"{layer}.{name}{tuple(param.shape)}".encode())
            digest.update(data.numpy().tobytes())
    return {**config_fingerprint(model.config), "attention_sha256": digest.hexdigest(), "dtype": dtype}
