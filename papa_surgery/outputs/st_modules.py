"""A sentence-transformers folder's modules (``modules.json``), read and checked, and the code files its own module
classes load: what a checkpoint carries of them (:mod:`papa_surgery.conversion.st_files`) and counts as its own
(:mod:`.overwrite`). Torch-free.
"""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath, PureWindowsPath

from ..failures import one_line


def module_entries(folder: str | Path) -> list[dict]:
    """The modules of ``folder``'s ``modules.json`` in their order (the encoder first), each module's folder checked
    to lie inside ``folder``; ``ValueError`` naming the file and what to fix otherwise (sentence-transformers
    refuses such a model too)."""
    path = Path(folder) / "modules.json"
    try:
        modules = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path} cannot be read ({one_line(err)}); fix or remove it") from None
    if not modules or not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise ValueError(f"{path} is not a list of modules; fix or remove it")
    for module in modules:
        sub = str(module.get("path") or "")
        if (
            sub.startswith(("/", "\\"))
            or PureWindowsPath(sub).drive
            or ".." in PurePosixPath(sub.replace("\\", "/")).parts
        ):
            raise ValueError(
                f"{path} names the module folder {sub!r}, outside the model's folder (sentence-transformers refuses "
                "it too); make it a folder inside the model's, e.g. 1_Pooling"
            )
    try:
        return sorted(modules, key=lambda m: int(m.get("idx", 0)))
    except (TypeError, ValueError):
        raise ValueError(f"{path} has a module whose idx is not a number; fix it") from None


def json_object(path: Path) -> dict:
    """The JSON object in ``path`` (``{}``: no such file)."""
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def json_list(path: Path) -> list:
    """The JSON list in ``path``; ``[]`` when there is none (no file, unreadable, not a list)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return []
    return data if isinstance(data, list) else []


def module_code_files(folder: str | Path) -> list[str]:
    """The top-level ``.py`` files of ``folder`` that its ``modules.json``'s own-code modules load: a module type
    ``file.Class`` (sentence-transformers loads it from ``file.py`` beside ``modules.json``, as transformers'
    ``get_class_from_dynamic_module`` does) and the files that file imports relatively; sorted names.

    papa-surgery's own model code (``hub_code``) is never among them: a checkpoint's code is written by papa-surgery.
    """
    from .. import hub_code

    folder = Path(folder)
    ours = {p.name for p in Path(hub_code.__file__).parent.glob("*.py")}
    names: set[str] = set()
    for module in json_list(folder / "modules.json"):  # any folder (--overwrite asks): a bad file holds none
        kind = str(module.get("type") or "") if isinstance(module, dict) else ""
        if kind.startswith("sentence_transformers.") or kind.count(".") != 1:  # the library's, or an installed package
            continue
        entry = folder / f"{kind.split('.')[0]}.py"
        if entry.is_file():
            from transformers.dynamic_module_utils import get_relative_import_files  # only for a module of own code

            names |= {entry.name, *(Path(f).name for f in get_relative_import_files(entry) if Path(f).is_file())}
    return sorted(names - ours)
