"""What the Hub knows a checkpoint by: its base model, whether its source is local, its pipeline tag and auto class,
and the Hub datasets its corpus came from (the model card's metadata, from ``config.json`` and ``papa_recipe.json``)."""

from __future__ import annotations

import re
from pathlib import Path

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")

_PIPELINE_TAGS = {
    "ForMaskedLM": "fill-mask",
    "ForSequenceClassification": "text-classification",
    "ForTokenClassification": "token-classification",
    "ForQuestionAnswering": "question-answering",
}


def base_model_id(source: dict, name: str | None) -> str | None:
    """The Hub id to declare as ``base_model``: the model the source derives from (``source.base_model``, which
    is the source itself when it is a Hub model), else ``source.hub_id``, else a ``namespace/name`` source."""
    for candidate in (source.get("base_model"), source.get("hub_id")):
        if candidate and is_hub_id(candidate):
            return candidate
    if name and "/" in name and is_hub_id(name) and not Path(name).exists():
        return name
    return None


def source_facts(config: dict, source: dict) -> tuple[str | None, bool]:
    """(the source's name to show, whether it is a local model), from ``papa_recipe.json``'s ``source``.

    Recipes written before local sources were named kept ``"local model"`` and the folder's ``local_name``.
    """
    name = config.get("papa_source_model") or source.get("model")
    if source.get("model") == "local model":
        return source.get("local_name") or config.get("papa_source_model"), True
    return name, bool(source.get("local")) and not source.get("hub_id")


def is_hub_id(name: str | None) -> bool:
    """Whether ``name`` looks like a Hub repo id (``org/name`` or ``name``), not a local path."""
    return bool(name) and bool(_HUB_ID.match(name)) and not name.startswith((".", "/")) and ".." not in name


def pipeline_tag_for(architectures) -> str:
    """Hub pipeline tag of a checkpoint's model class (``feature-extraction`` for the bare encoder)."""
    for arch in architectures or []:
        for suffix, tag in _PIPELINE_TAGS.items():
            if arch.endswith(suffix):
                return tag
    return "feature-extraction"


def auto_class_for(architectures) -> str:
    """The ``transformers`` auto class that loads a checkpoint's model class."""
    for arch in architectures or []:
        for suffix in (*_PIPELINE_TAGS, "ForMultipleChoice"):
            if arch.endswith(suffix):
                return f"AutoModel{suffix}"
    return "AutoModel"


def hub_datasets(corpus: dict) -> list[str]:
    """Hub datasets a calibration corpus came from (``hub_dataset`` or a ``name[:config]:split:column`` spec)."""
    names = []
    description = str(corpus.get("description") or "")
    if description.startswith("Hub dataset "):  # corpus.load_corpus's description of a Hub spec
        spec = description[len("Hub dataset ") :].split()[0]
        if is_hub_id(spec.split(":")[0]):
            names.append(spec.split(":")[0])
    for key in ("hub_dataset", "dataset", "spec", "source"):
        value = corpus.get(key)
        if not isinstance(value, str) or not value:
            continue
        name = value.split(":")[0] if value.count(":") >= 2 else (value if key == "hub_dataset" else "")
        if is_hub_id(name) and not Path(name).exists():
            names.append(name)
    return sorted(set(names))
