"""The checkpoint format gate: which PAPA formats this code reads, and what a ``config.json`` must say for it.

A PAPA checkpoint states its format in ``config.json`` (``papa_format_version``): what its ``papa_*`` fields and
stored tensors mean. The code that reads a checkpoint, whether the copy shipped inside it or papa-surgery's own
classes, checks it here before anything is built:

- a format newer than :data:`FORMAT_VERSION` is refused, in one sentence naming both versions and the fix (newer
  code, or an older revision of the checkpoint): this code would misread it;
- a config without the field is read as the oldest format (:data:`OLDEST_FORMAT`): the field was written from
  format 1 on, and only a hand-made config lacks it, which must not be taken for the newest;
- ``papa_*`` fields this code does not know are named in one warning and ignored (as peft does for its
  configs): a newer papa-surgery may add optional fields.

The formats (what changed, for the code that reads them):

1. compact constants are their dense rebuild clamped at 0;
2. compact constants are used as stored (a long input applies their structure without the rebuild).

This file ships inside every PAPA checkpoint: it imports only the standard library.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable

FORMAT_VERSION = 2  # what this code writes, and the newest it reads
OLDEST_FORMAT = 1  # what a config without papa_format_version is read as
FORMAT_FIELD = "papa_format_version"
_warned: set[tuple[str, ...]] = set()  # unknown fields already named (a load reads its config more than once)


class CheckpointFormatError(ValueError):
    """A checkpoint in a format this code cannot read (newer than :data:`FORMAT_VERSION`, or not a format number)."""

    def __init__(self, message: str, found=None):
        super().__init__(message)
        self.found = found


def format_of(config) -> int:
    """The format a PAPA config (object or dict) is in: its ``papa_format_version``, :data:`OLDEST_FORMAT` when it
    has none; :class:`CheckpointFormatError` for one this code cannot read."""
    value = config.get(FORMAT_FIELD) if isinstance(config, dict) else getattr(config, FORMAT_FIELD, None)
    if value is None:
        return OLDEST_FORMAT
    if isinstance(value, bool) or not isinstance(value, int) or value < OLDEST_FORMAT:
        raise CheckpointFormatError(
            f"config.json has {FORMAT_FIELD}={value!r}, which is no PAPA format (this code reads {OLDEST_FORMAT} to "
            f"{FORMAT_VERSION}): restore the checkpoint's config.json from where it was published or saved",
            value,
        )
    if value > FORMAT_VERSION:
        raise CheckpointFormatError(
            f"this PAPA checkpoint is format v{value}, newer than the v{FORMAT_VERSION} this code reads: load it with "
            f"code that knows v{value} (pip install -U papa-surgery, or re-save the checkpoint with a newer "
            f"papa-surgery so the code it ships knows it), or load a revision of the checkpoint saved in format "
            f"v{FORMAT_VERSION} or older",
            value,
        )
    return value


def read_papa_fields(config_dict: dict, known: Iterable[str]) -> dict:
    """``config_dict`` as this code reads it: its format checked (:func:`format_of`), a missing version set to
    :data:`OLDEST_FORMAT`, and ``papa_*`` fields not in ``known`` dropped, named in a ``UserWarning`` (once per
    process and set of fields)."""
    out, known = dict(config_dict), set(known)
    out[FORMAT_FIELD] = format_of(out)
    unknown = sorted(k for k in out if k.startswith("papa_") and k not in known)
    if unknown and tuple(unknown) not in _warned:
        _warned.add(tuple(unknown))
        warnings.warn(
            f"config.json has PAPA field(s) {unknown} that this code (format v{FORMAT_VERSION}) does not know, so "
            "they are ignored: the checkpoint was probably written by a newer papa-surgery; upgrade papa-surgery "
            "(pip install -U papa-surgery) or re-save the checkpoint with it to use them",
            UserWarning,
            stacklevel=3,
        )
    for key in unknown:
        del out[key]
    return out
