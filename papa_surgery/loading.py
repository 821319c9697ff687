"""Load a source model (Hub id or folder) or a PAPA checkpoint, with the errors users need."""

from __future__ import annotations

from pathlib import Path

import torch

from .architectures import get_family, is_papa_config

DTYPES = {
    "fp32": torch.float32,
    "float32": torch.float32,
    "fp16": torch.float16,
    "float16": torch.float16,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
}


def resolve_dtype(dtype: str | torch.dtype | None) -> torch.dtype | None:
    """``fp32|fp16|bf16`` (or a torch dtype) -> torch dtype."""
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; use fp32, fp16 or bf16")
    return DTYPES[dtype]


def public_name(source: str | None) -> str | None:
    """A Hub id stays; a local folder is recorded by its name only (no paths in configs or provenance)."""
    if not source:
        return None
    path = Path(str(source))
    if path.exists() or str(source).startswith(("/", ".", "~")):
        return path.name
    return str(source)


def load_config(name_or_path: str, revision: str | None = None):
    """The config of a supported source model or PAPA checkpoint (ValueError otherwise)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(name_or_path, revision=revision, trust_remote_code=_is_papa_dir(name_or_path))
    get_family(config)  # unsupported architecture -> ValueError listing the supported ones
    return config


def _is_papa_dir(name_or_path: str) -> bool:
    import json

    cfg = Path(name_or_path) / "config.json"
    if not cfg.is_file():
        return False
    return str(json.loads(cfg.read_text()).get("model_type", "")).startswith("papa_")


def load_source(
    name_or_path: str,
    auto_class: str = "AutoModel",
    revision: str | None = None,
    dtype: str | torch.dtype | None = None,
    device: str | None = None,
    **model_kwargs,
):
    """(model, tokenizer) for a Hub id or local folder of a supported family, in eval mode.

    PAPA checkpoints load too (``trust_remote_code`` is enabled only for them).
    """
    import transformers

    config = load_config(name_or_path, revision)
    remote = is_papa_config(config)
    cls = getattr(transformers, auto_class)
    model, info = cls.from_pretrained(
        name_or_path,
        revision=revision,
        dtype=resolve_dtype(dtype),
        trust_remote_code=remote,
        output_loading_info=True,
        **model_kwargs,
    )
    prefix = getattr(model, "base_model_prefix", "") + "."
    missing_head = [k for k in info.get("missing_keys", []) if not k.startswith(prefix)]
    if auto_class == "AutoModelForMaskedLM" and missing_head:
        # A folder saved without its MLM head silently gets a random one: its perplexity would mean nothing.
        raise ValueError(
            f"task 'mlm' needs a model with a masked-LM head (AutoModelForMaskedLM), but {name_or_path} has no "
            f"weights for it (missing {', '.join(sorted(missing_head)[:3])}...); use a model or checkpoint saved "
            f"with its MLM head"
        )
    tokenizer = transformers.AutoTokenizer.from_pretrained(name_or_path, revision=revision)
    if device is not None:
        model.to(device)
    return model.eval(), tokenizer
