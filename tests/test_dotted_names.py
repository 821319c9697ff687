"""Every dotted ``papa_surgery.x.y`` name written in the package resolves (issue 31, item 6).

Messages, docstrings and comments name modules and functions for users and readers to find (``write the model card
with papa_surgery.conversion.card.write_card``); after modules move, such a name points nowhere. Each one written
under ``papa_surgery/`` (and in the model card template) must import as a module or resolve as an attribute.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOTTED = re.compile(r"\bpapa_surgery(?:\.[A-Za-z_][A-Za-z0-9_]*)+")


def written_names() -> dict[str, list[str]]:
    """``{dotted name: ["file:line", ...]}`` for every ``papa_surgery.x[.y...]`` in the package's text."""
    files = [*sorted((ROOT / "papa_surgery").rglob("*.py")), *sorted((ROOT / "cards").glob("*.md"))]
    found: dict[str, list[str]] = {}
    for path in files:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            for match in DOTTED.finditer(line):
                found.setdefault(match.group(), []).append(f"{path.relative_to(ROOT)}:{number}")
    return found


def resolves(name: str) -> bool:
    """Whether ``name`` is a module, or an attribute reached from the longest module prefix that imports."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        try:
            target = importlib.import_module(".".join(parts[:end]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[end:]:
            if not hasattr(target, attribute):
                return False
            target = getattr(target, attribute)
        return True
    return False


def test_the_resolver_tells_a_moved_name_from_a_present_one():
    assert resolves("papa_surgery.conversion.card.write_card") and resolves("papa_surgery.outputs.staging")
    assert resolves("papa_surgery.calibrate")  # the package's lazily re-exported workflow function
    assert not resolves("papa_surgery.card.write_card") and not resolves("papa_surgery.atomic")
    assert not resolves("papa_surgery.conversion.card.write_cards")


def test_every_dotted_name_written_in_the_package_resolves():
    names = written_names()
    assert len(names) > 20  # the scan reads the package (docstrings and messages name many)
    stale = {name: where for name, where in names.items() if not resolves(name)}
    assert not stale, "names that point nowhere: " + "; ".join(f"{n} ({', '.join(w)})" for n, w in stale.items())
