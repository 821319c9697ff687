"""Published checkpoints keep loading on transformers releases newer than the tested range (issue 19, item 5).

The shipped code refuses only a release older than its floor; past its tested range it warns once and loads.
``scripts/test-newest.sh`` installs the newest transformers PyPI serves (pre-releases included) into a venv of its
own and points ``PAPA_NEWEST_PYTHON`` at it; the round trips below then load checkpoints saved here in a fresh
process there (they skip without it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import pytest
from test_checkpoint import LOADER, _round_trip_every_family_and_auto_class, fresh_python
from test_compact import _jobs
from test_trust import assert_shipped_code_gates_the_format

from papa_surgery.hub_code import compat
from papa_surgery.hub_code.families import FAMILIES

pytestmark = pytest.mark.usefixtures("one_thread")


def test_an_older_transformers_is_refused_with_the_release_needed():
    with pytest.raises(ImportError, match=r"needs transformers>=5\.0, but transformers 4\.57\.1 is installed"):
        compat.check_transformers_version("4.57.1")


def test_a_newer_transformers_loads_with_one_warning(monkeypatch):
    monkeypatch.setattr(compat, "_warned_untested", False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning within the tested range fails here
        compat.check_transformers_version("5.0.0")
        compat.check_transformers_version("5.99.0")
    with pytest.warns(UserWarning, match=r"tested with transformers>=5\.0,<6\.0; transformers 6\.0\.0rc1 is newer"):
        compat.check_transformers_version("6.0.0rc1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per process
        compat.check_transformers_version("6.1.0")
        compat.check_transformers_version("7.0.0")


def newest_python() -> tuple[str, tuple[int, int]]:
    python = os.environ.get("PAPA_NEWEST_PYTHON")
    if not python:
        pytest.skip(
            "PAPA_NEWEST_PYTHON is not set: scripts/test-newest.sh installs the newest transformers and sets it"
        )
    version = subprocess.run(
        [python, "-c", "import transformers; print(transformers.__version__)"], capture_output=True, text=True
    ).stdout.strip()
    major, minor = (int(x) for x in version.split(".")[:2])
    print(f"newest transformers: {version}")
    return python, (major, minor)


def test_round_trip_on_the_newest_transformers(tiny, tmp_path):
    python, version = newest_python()
    families = [t for t in sorted(FAMILIES) if FAMILIES[t].min_transformers <= version]
    _round_trip_every_family_and_auto_class(tiny, tmp_path, python, families=families)


def test_compact_checkpoints_on_the_newest_transformers(tiny, tmp_path):
    python, _ = newest_python()
    _jobs(tiny, tmp_path)
    result = fresh_python(LOADER, str(tmp_path / "jobs.json"), cwd=tmp_path, python=python)
    assert "ALL-OK" in result.stdout, result.stdout + result.stderr[-4000:]
    assert len(json.loads((tmp_path / "jobs.json").read_text())) > 0 and sys.executable != python


def test_the_format_gate_on_the_newest_transformers(tmp_path):
    """The shipped code refuses a newer checkpoint format and reads a missing one as format 1 there too."""
    from fake_hub import build_tiny_checkpoint

    python, _ = newest_python()
    folder, _, _ = build_tiny_checkpoint(tmp_path / "tiny-papa")
    assert_shipped_code_gates_the_format(folder, tmp_path, python)
