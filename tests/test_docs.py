"""The documentation's numbers have their provenance: every benchmark results file the README or a docs page cites
exists (``benchmarks/results/<benchmark>.json`` / ``.txt``, written by a benchmark's ``--save``, or transcribed from an
earlier README and called so where it is cited), and every docs page the README links to exists."""

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
        if data.get("transcribed"):  # measured before results files existed: says where from, and says so
            assert data.get("transcribed_from") and data["commit"], f"{path.name}: transcribed from where?"


def test_a_transcribed_record_is_called_one_where_it_is_cited():
    import json

    for page in PAGES:
        for paragraph in re.split(r"\n\s*\n", page.read_text(encoding="utf-8")):
            for cited in re.findall(r"benchmarks/results/([\w.-]+)\.(?:json|txt)", paragraph):
                record = ROOT / "benchmarks" / "results" / f"{cited}.json"
                if record.is_file() and json.loads(record.read_text()).get("transcribed"):
                    assert "transcribed" in paragraph, f"{page.name} cites {cited} without saying it is transcribed"


def test_every_relative_link_resolves():
    """The README's links to docs/ and the docs pages' links to each other and to results files, anchors included."""
    missing = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists():
                missing.append(f"{page.name}: {target}")
            elif anchor and file.suffix == ".md":
                headings = re.findall(r"^#+ (.+)$", file.read_text(encoding="utf-8"), re.M)
                slugs = {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}
                if anchor not in slugs:
                    missing.append(f"{page.name}: {target} (no such heading)")
    assert not missing, f"links that lead nowhere: {missing}"


def test_the_readme_links_every_docs_page():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    unlinked = [p.name for p in (ROOT / "docs").glob("*.md") if f"](docs/{p.name}" not in readme]
    assert not unlinked, f"docs pages the README does not link: {unlinked}"


def test_the_readme_is_a_short_read_with_the_set_up_first():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250, f"the README has {len(lines)} lines; the depth belongs in docs/"
    head = "\n".join(lines[:60])
    assert "bash scripts/demo.sh" in head and "bash scripts/test.sh" in head
