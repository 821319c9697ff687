"""The model code that ships inside every PAPA checkpoint (imports only torch, transformers and siblings).

This ``__init__`` is library-side only: ``save_pretrained`` copies ``modeling_papa.py`` and the siblings it
imports, which are exactly the files listed here.
"""

from pathlib import Path

HUB_CODE_FILES: tuple[str, ...] = tuple(
    sorted(p.name for p in Path(__file__).parent.glob("*.py") if p.name != "__init__.py")
)
