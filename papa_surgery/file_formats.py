"""The format versions of the files papa-surgery writes besides checkpoints (constants, rankings), checked on load.

A checkpoint's own format is gated by the code it ships (:mod:`papa_surgery.hub_code.checkpoint_format`).
"""

from __future__ import annotations

# The format version of each kind of file papa-surgery writes besides checkpoints (whose format the shipped code
# gates): a file of a newer version is refused on load, one without a version is version 1.
FILE_FORMATS = {"constants": 1, "ranking": 1}


def check_file_format(what: str, found, path) -> None:
    """ValueError when a ``what`` file (``constants``, ``ranking``) says a format newer than this library reads."""
    known = FILE_FORMATS[what]
    # a whole number from 1: an int in a ranking's JSON, its digits in a constants file's safetensors metadata
    # (whose values are all strings)
    digits = what == "constants" and isinstance(found, str) and found.isdigit()
    whole = digits or (what != "constants" and isinstance(found, int) and not isinstance(found, bool))
    version = 1 if found is None else int(found) if whole else 0
    if version < 1:
        raise ValueError(
            f"{what} file {str(path)!r} has a damaged format version {found!r} (a whole number from 1): make the "
            "file again with papa-surgery"
        )
    if version > known:
        raise ValueError(
            f"{what} file {str(path)!r} is of format {version}, newer than the {known} this papa-surgery reads: "
            f"upgrade papa-surgery (pip install -U papa-surgery), or make the file again with this version"
        )
