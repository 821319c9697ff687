"""Which code reads a PAPA checkpoint inside papa-surgery: the library's own classes, or the folder's by opt-in only.

A PAPA checkpoint ships its model code (``modeling_papa.py`` and its siblings) for users without papa-surgery;
transformers runs it with ``trust_remote_code=True``. papa-surgery never needs to: its ``hub_code`` is that code, at
the installed version. :func:`register_papa_classes` registers it for the checkpoint family's ``papa_*`` model type
with transformers' auto classes (``AutoConfig.register``, ``AutoModel*.register``), so ``from_pretrained`` of a PAPA
folder or Hub id builds the library's classes with no ``trust_remote_code`` and never imports the folder's files;
:func:`papa_classes` does so for the length of a load only, leaving transformers as the user had it.
Those classes read the checkpoint through the format gate (``hub_code/checkpoint_format.py``): a format newer than
this papa-surgery knows is refused (:func:`library_format_error` says how to get on), never handed to other code.

A user who wants a checkpoint's own code asks for it (``trust_remote_code=True``, ``--trust-remote-code``):
:func:`shipped_config_class` then imports the folder's configuration class explicitly, since transformers 5.24
prefers registered classes to a folder's code even when ``trust_remote_code=True``, and 5.0 does not.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from .. import __version__
from ..failures import spell
from ..hub_code.checkpoint_format import FORMAT_VERSION, CheckpointFormatError
from ..hub_code.families import PAPA_MODEL_TYPES, family_for


def is_papa_model_type(model_type) -> bool:
    """Whether a ``config.json``'s ``model_type`` is a PAPA checkpoint's (``papa_<family>``)."""
    return model_type in PAPA_MODEL_TYPES


def register_papa_classes(model_type: str) -> type:
    """Register papa-surgery's classes of ``model_type``'s family with transformers' auto classes; its config class.

    Idempotent. Only the family asked for is built (a family's classes import its transformers module), and a family
    newer than the installed transformers raises the ``ImportError`` that names the release it needs.
    """
    import transformers

    from ..hub_code.configuration_papa import papa_config_class
    from ..hub_code.modeling_papa import papa_model_class

    family = family_for(model_type)
    family.check_transformers()
    config_class = papa_config_class(family.model_type)
    transformers.AutoConfig.register(family.papa_model_type, config_class, exist_ok=True)
    for auto_class in family.auto_classes:
        model_class = papa_model_class(family.model_type, auto_class)
        getattr(transformers, auto_class).register(config_class, model_class, exist_ok=True)
    return config_class


@contextlib.contextmanager
def papa_classes(model_type: str) -> Iterator[type]:
    """:func:`register_papa_classes` for the ``with`` block only; its config class (``None``, and nothing
    registered, for a model type that is not a PAPA checkpoint's).

    Afterwards transformers' auto mappings hold what they held before. Left registered, the library's classes
    answered a user's own ``AutoModel.from_pretrained(checkpoint, trust_remote_code=True)`` later in the same
    process (transformers prefers a registered class to a folder's code): the checkpoint's code never ran, and a
    checkpoint of a newer format, which its own code reads, was refused.
    """
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    from ..hub_code.configuration_papa import papa_config_class

    if not is_papa_model_type(model_type):
        yield None
        return
    family = family_for(model_type)
    family.check_transformers()  # a family newer than transformers: the release it needs, before its classes build
    config_class = papa_config_class(family.model_type)
    places = [(CONFIG_MAPPING, family.papa_model_type)]
    places += [(getattr(transformers, a)._model_mapping, config_class) for a in family.auto_classes]
    places = [(getattr(mapping, "_extra_content", None), key) for mapping, key in places]
    before = [(extra, key, extra.get(key, _MISSING)) for extra, key in places if extra is not None]
    try:
        yield register_papa_classes(model_type)
    finally:
        for extra, key, value in before:
            if value is _MISSING:
                extra.pop(key, None)
            else:
                extra[key] = value


_MISSING = object()


def shipped_config_class(name_or_path: str, config_dict: dict, **hub_kwargs) -> type:
    """The configuration class a checkpoint ships (its ``auto_map``'s ``AutoConfig``), imported from its own files:
    only for a user who asked to run them (``trust_remote_code=True``).

    Raises:
        ValueError: the checkpoint declares no code of its own.
    """
    from transformers.dynamic_module_utils import get_class_from_dynamic_module

    reference = (config_dict.get("auto_map") or {}).get("AutoConfig")
    if not reference:
        raise ValueError(
            f"{name_or_path} ships no model code of its own (its config.json has no auto_map): load it without "
            f"{spell('trust_remote_code', True)}, with papa-surgery's classes"
        )
    return get_class_from_dynamic_module(reference, name_or_path, **hub_kwargs)


def library_format_error(name_or_path: str, err: CheckpointFormatError) -> CheckpointFormatError:
    """The format gate's refusal in papa-surgery's words: the versions, and the fixes open to this user."""
    if not isinstance(err.found, int) or isinstance(err.found, bool) or err.found <= FORMAT_VERSION:
        return CheckpointFormatError(f"{name_or_path}: {err}", err.found)
    return CheckpointFormatError(
        f"{name_or_path} is PAPA format v{err.found}, newer than the v{FORMAT_VERSION} papa-surgery {__version__} "
        f"reads: upgrade papa-surgery (pip install -U papa-surgery), or pass {spell('trust_remote_code', True)} to "
        "run the checkpoint's own code if you trust it",
        err.found,
    )
