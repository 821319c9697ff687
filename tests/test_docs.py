"""The documentation's numbers have their provenance: every benchmark results file the README or a docs page cites
exists (``benchmarks/results/<benchmark>.json`` / ``.txt``, written by a benchmark's ``--save``), and every docs page
the README links to exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _cited(pattern: str) -> list[tuple[Path, str]]:
    return [(page, m.group(1)) for page in PAGES for m in re.finditer(pattern, page.read_text(encoding="utf-8"))]


def test_every_cited_results_file_exists():
    cited = _cited(r"(benchmarks/results/[\w.-]+\.(?:json|txt))")
    missing = [f"{page.name}: {path}" for page, path in cited if not (ROOT / path).is_file()]
    assert not missing, f"cited results files that do not exist: {missing}"


def test_every_results_file_has_its_provenance():
    import json

    for path in sorted((ROOT / "benchmarks" / "results").glob("*.json")):
        data = json.loads(path.read_text())
        for key in ("command", "commit", "date", "machine", "torch_threads", "versions", "rows", "printed"):
            assert key in data, f"{path.name} lacks {key!r}"
        assert path.with_suffix(".txt").is_file(), f"{path.name} has no .txt beside it"


def test_every_linked_docs_page_exists():
    cited = _cited(r"\]\((docs/[\w./-]+\.md)(?:#[\w-]+)?\)")
    missing = [f"{page.name}: {path}" for page, path in cited if not (ROOT / path).is_file()]
    assert not missing, f"linked docs pages that do not exist: {missing}"
