"""Load a source model (Hub id or folder) or a PAPA checkpoint, with the errors users need."""

from __future__ import annotations

import functools
import logging
import re
from pathlib import Path

import torch

from ..failures import NotFound, one_line
from .families import get_family

logger = logging.getLogger("papa_surgery")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")

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


def position_limit(config) -> int | None:
    """How many tokens the model's absolute position embeddings cover (``None``: no absolute limit).

    RoBERTa-style families (roberta, xlm-roberta, mpnet) number positions after the padding index, so
    ``max_position_embeddings=514`` covers 512 tokens; DeBERTa without ``position_biased_input`` has none.
    """
    model_type = str(getattr(config, "model_type", "")).removeprefix("papa_")
    if model_type in ("deberta", "deberta-v2") and not getattr(config, "position_biased_input", True):
        return None
    limit = getattr(config, "max_position_embeddings", None)
    if not isinstance(limit, int) or limit <= 0:
        return None
    if model_type in ("roberta", "xlm-roberta", "mpnet"):
        limit -= int(getattr(config, "pad_token_id", 1) or 0) + 1
    return limit


def public_name(source: str | None) -> str | None:
    """A Hub id stays; a local folder is recorded by its name only (no paths in configs or provenance)."""
    if not source:
        return None
    path = Path(str(source))
    if path.exists() or str(source).startswith(("/", ".", "~")):
        return path.name
    return str(source)


def load_config(
    name_or_path: str,
    revision: str | None = None,
    local_files_only: bool | None = None,
    trust_remote_code: bool = False,
):
    """The config of a supported source model or PAPA checkpoint (ValueError naming the model and the fix).

    A PAPA checkpoint's config is read by papa-surgery's own classes (:mod:`.papa_classes`), through the format
    gate; with ``trust_remote_code=True`` by the configuration code the checkpoint ships, which the user chose to run.
    """
    from transformers import AutoConfig

    from ..hub_code.checkpoint_format import CheckpointFormatError
    from .papa_classes import is_papa_model_type, library_format_error, papa_classes, shipped_config_class

    if local_files_only is None:
        local_files_only = check_model_location(name_or_path)
    hub = {"revision": revision, "local_files_only": local_files_only}
    try:
        config_dict = _config_dict(name_or_path, hub)
        if not is_papa_model_type(config_dict.get("model_type")):
            config = AutoConfig.from_pretrained(name_or_path, trust_remote_code=trust_remote_code, **hub)
        elif trust_remote_code:
            config = shipped_config_class(name_or_path, config_dict, **hub).from_pretrained(name_or_path, **hub)
        else:
            with papa_classes(config_dict["model_type"]) as config_class:
                config = config_class.from_pretrained(name_or_path, **hub)
    except OSError as err:  # not on the Hub, not in the cache, no config.json
        raise ValueError(_not_found(name_or_path, err, local_files_only)) from err
    except CheckpointFormatError as err:  # papa-surgery's classes cannot read it: refused, never run by other code
        if trust_remote_code:
            raise
        raise library_format_error(name_or_path, err) from None
    get_family(config)  # unsupported architecture -> ValueError listing the supported ones
    return config


def _config_dict(name_or_path: str, hub: dict) -> dict:
    """``config.json`` as a dict, from a folder or the Hub (OSError when there is none)."""
    import json

    from transformers import PreTrainedConfig

    path = Path(name_or_path) / "config.json"
    if not path.is_file():
        return PreTrainedConfig.get_config_dict(name_or_path, **hub)[0]
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is not valid JSON ({err}); re-save the model") from None


EMBEDDED_NAMES = ("minilm", "embedded")


def is_hub_id(name: str) -> bool:
    """Whether ``name`` reads as a Hub model id (``org/name`` or ``name``), not a path."""
    return not _looks_local(name) and bool(_HUB_ID.match(name))


def _looks_local(name: str) -> bool:
    """A path rather than a Hub id: absolute, relative with ./ ../ ~, or more than one ``/``."""
    return name.startswith(("/", "./", "../", "~", "\\")) or name in (".", "..") or name.count("/") > 1


def _close_names(name: str) -> list[str]:
    """Local folders and the embedded model whose names resemble ``name`` (a typo's likely meaning)."""
    import difflib

    base = Path(name).expanduser()
    parent = base.parent if str(base.parent) not in ("", ".") else Path(".")
    try:
        folders = [p.name for p in parent.iterdir() if p.is_dir() and not p.name.startswith(".")]
    except OSError:
        folders = []
    matches = difflib.get_close_matches(base.name, [*folders, *EMBEDDED_NAMES], n=3, cutoff=0.6)
    return [m if m in EMBEDDED_NAMES or parent == Path(".") else str(parent / m) for m in matches]


def _suggest(name: str) -> str:
    close = _close_names(name)
    hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    return hint + " (`minilm` is the embedded all-MiniLM-L6-v2)"


def hub_reachable(timeout: float = 5.0) -> bool:
    """Whether the Hub endpoint answers at all: one quick request (no retries), asked once per process and endpoint.

    Without it, an offline machine that has not set ``HF_HUB_OFFLINE=1`` waits through every client's retries.
    """
    from huggingface_hub import constants

    return _answers(constants.ENDPOINT, timeout)


@functools.lru_cache(maxsize=8)
def _answers(endpoint: str, timeout: float) -> bool:
    import urllib.error
    import urllib.request

    try:
        urllib.request.urlopen(urllib.request.Request(endpoint, method="HEAD"), timeout=timeout)
    except urllib.error.HTTPError:
        return True  # it answered
    except (OSError, ValueError):
        return False
    return True


def check_model_location(name: str) -> bool:
    """Check a MODEL argument before anything is fetched; return whether to read only local files.

    A local path must exist and be a model folder; a Hub id is looked up in the cache only when the Hub is
    offline (``HF_HUB_OFFLINE=1``) or does not answer (one quick request instead of minutes of retries).

    Raises:
        FileNotFoundError: a missing folder (with close names); also a ``ValueError``.
        ValueError: a file, a folder with no config.json, or a Hub id that cannot be reached or found.
    """
    from huggingface_hub import constants

    path = Path(name).expanduser()
    if path.is_file():
        raise ValueError(
            f"MODEL {name!r} is a file; pass the folder that holds config.json and the weights, or a Hub id"
        )
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ValueError(f"model folder {name!r} has no config.json; pass a folder saved with save_pretrained")
        return True
    if not is_hub_id(name):
        raise NotFound(f"model folder {name!r} does not exist{_suggest(name)}")
    if constants.HF_HUB_OFFLINE:
        return True
    if not hub_reachable():
        logger.warning("the Hugging Face Hub does not answer: looking for %r in the local cache only", name)
        return True
    return False


def _not_found(name: str, err: Exception, local_only: bool) -> str:
    from huggingface_hub import constants

    if local_only and not Path(name).expanduser().is_dir():
        if constants.HF_HUB_OFFLINE:
            why, fix = "HF_HUB_OFFLINE=1 is set", "or unset HF_HUB_OFFLINE to download it"
        else:
            why, fix = "the Hugging Face Hub could not be reached", "or set HF_HUB_OFFLINE=1 to work from the cache"
        return (
            f"model {name!r} is not a local folder or in the Hugging Face cache, and {why}: pass a local model "
            f"folder{_suggest(name)}, {fix}"
        )
    if "/" not in name:
        return f"{name!r} is neither a local folder nor a model on the Hugging Face Hub{_suggest(name)}"
    first = one_line(err)
    return f"could not load model {name!r}: {first}"


def _warn_unrun_code(name_or_path: str, config, model, auto_class: str, trust_remote_code: bool) -> None:
    """Say so when a source ships model code of its own (``auto_map``) for a class other than the one transformers
    built it with: none of that code ran, as asked, and the converted model follows transformers' class. The native
    reimplementation of the same class (Nomic Embed's ``NomicBertModel``, EuroBERT's) is what papa-surgery supports,
    and is not worth a warning."""
    from .papa_classes import is_papa_model_type

    auto_map = getattr(config, "auto_map", None)
    if trust_remote_code or not isinstance(auto_map, dict) or is_papa_model_type(config.model_type):
        return
    shipped = auto_map.get(auto_class) or auto_map.get("AutoModel")
    shipped = shipped[0] if isinstance(shipped, (list, tuple)) else shipped  # (slow, fast) pairs are tokenizers'
    built = type(model).__name__
    if not isinstance(shipped, str) or shipped.rsplit(".", 1)[-1] == built:
        return
    logger.warning(
        "%s ships model code of its own (%s: %s), which was not run: transformers' %s built it, and the converted "
        "model follows that class where the two differ",
        name_or_path,
        auto_class if auto_class in auto_map else "AutoModel",
        shipped,
        built,
    )


def load_source(
    name_or_path: str,
    auto_class: str = "AutoModel",
    revision: str | None = None,
    dtype: str | torch.dtype | None = None,
    device: str | None = None,
    trust_remote_code: bool = False,
    **model_kwargs,
):
    """(model, tokenizer) for a Hub id or local folder of a supported family, in eval mode.

    PAPA checkpoints load with papa-surgery's own classes, never with the code files in the folder or repository,
    unless ``trust_remote_code=True`` asks for them (see :mod:`.papa_classes`); a source model's remote code, too,
    runs only then.
    """
    import contextlib

    from .papa_classes import papa_classes

    local_only = check_model_location(name_or_path)
    config = load_config(name_or_path, revision, local_files_only=local_only, trust_remote_code=trust_remote_code)
    # a PAPA checkpoint's classes registered for this load only; with trust_remote_code its own code builds it
    with contextlib.nullcontext() if trust_remote_code else papa_classes(config.model_type):
        model, tokenizer = _model_and_tokenizer(name_or_path, config, auto_class, revision, dtype, trust_remote_code,
                                                local_only, model_kwargs)  # fmt: skip
    if device is not None:
        model.to(device)
    return model.eval(), tokenizer


def _model_and_tokenizer(name_or_path, config, auto_class, revision, dtype, trust_remote_code, local_only, kwargs):
    """The model of ``config`` and its tokenizer (``kwargs``: the model's), as :func:`load_source` describes."""
    import transformers

    cls = getattr(transformers, auto_class)
    # The config object decides whose classes build the model: the library's registered ones, or (opted in) those of
    # the checkpoint's own code, which transformers imports for a config class it has no registered model for.
    model, info = cls.from_pretrained(
        name_or_path,
        config=config,
        revision=revision,
        dtype=resolve_dtype(dtype),
        trust_remote_code=trust_remote_code,
        output_loading_info=True,
        local_files_only=local_only,
        **kwargs,
    )
    _warn_unrun_code(name_or_path, config, model, auto_class, trust_remote_code)
    prefix = getattr(model, "base_model_prefix", "") + "."
    missing_head = [k for k in info.get("missing_keys", []) if not k.startswith(prefix)]
    if auto_class == "AutoModelForMaskedLM" and missing_head:
        # A folder saved without its MLM head silently gets a random one: its perplexity would mean nothing.
        raise ValueError(
            f"task 'mlm' needs a model with a masked-LM head (AutoModelForMaskedLM), but {name_or_path} has no "
            f"weights for it (missing {', '.join(sorted(missing_head)[:3])}...); use a model or checkpoint saved "
            f"with its MLM head"
        )
    # A PAPA checkpoint's tokenizer reads the PAPA config, which the library's registered class now serves: no code
    # of the folder's runs (and transformers never asks interactively, which would block a terminal).
    tokenizer = transformers.AutoTokenizer.from_pretrained(
        name_or_path, revision=revision, trust_remote_code=trust_remote_code, local_files_only=local_only
    )
    return model, tokenizer
