"""Where an output may go at all, whatever is there: never the working folder (or one holding it), never through a
symbolic link, never a file path that names a folder. :mod:`.overwrite` decides what an existing output may be
replaced by; :mod:`.staging` moves a finished output into place whole.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..failures import flag, spell


def out_flag(argument: str) -> str:
    """The output argument as the user passes it: ``--out`` on the command line, ``out_dir`` (say) in Python."""
    return flag("out") if spell("out") == flag("out") else argument


def check_not_link(out: Path, argument: str = "out_dir", thing: str = "folder") -> None:
    """ValueError when ``out`` is a symbolic link: an output ``thing`` (a folder, a file) is moved into place whole,
    so it would replace the link itself (what it points to left as it was), never write where the link points."""
    if not Path(out).is_symlink():
        return
    target = Path(out).resolve()
    where = f"{target}" if target.exists() else f"{target}, which does not exist"
    raise ValueError(
        f"refusing to write to {str(out)!r}: it is a symbolic link (to {where}), which an output {thing} would "
        f"replace rather than write through; pass the {thing} it points to, or another {out_flag(argument)}"
    )


def check_not_cwd(out: Path, argument: str = "out_dir") -> None:
    """ValueError when the existing folder ``out`` is the working directory or holds it: an output folder is moved
    into place whole (the old one, or an empty one, removed), which would leave the shell in a removed folder."""
    try:
        here, folder = Path.cwd().resolve(), Path(out).resolve()
    except OSError:  # the working directory is gone already
        return
    if folder == here or folder in here.parents:
        where = "the folder you are working in" if folder == here else f"a folder holding the one you are in ({here})"
        raise ValueError(
            f"refusing to write into {str(out)!r}: it is {where}, and an output folder is moved into place whole, "
            f"which would pull it from under you; choose another {out_flag(argument)}: a path that does not exist yet"
        )


def check_file_path(path: str | Path, label: str, example: str, argument: str = "out") -> None:
    """ValueError when the file output ``path`` names a folder by its form: a trailing separator, or a last part
    ``.`` or ``..`` (``Path`` drops the first two, and would write a file named after the folder)."""
    text = os.fspath(path)
    if os.path.basename(text) in ("", ".", ".."):
        folder = text.rstrip("/" + os.sep) or text
        raise ValueError(
            f"{out_flag(argument)} {text!r} names a folder; pass a file path for the {label}, "
            f"e.g. {os.path.join(folder, example)}"
        )


def empty_folder(path: Path) -> bool:
    """Whether ``path`` is an empty folder (not a symlink): no one's output, written into without ``overwrite``."""
    return path.is_dir() and not path.is_symlink() and not any(path.iterdir())
