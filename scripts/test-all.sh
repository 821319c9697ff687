#!/usr/bin/env bash
# Every test tier: the fast tier and the slow one (torch.compile, ONNX, torchrun/accelerate, extra fresh-process
# loads, the real MiniLM weights), then the loading tests on the newest transformers PyPI serves
# (scripts/test-newest.sh: a venv of its own, about 3 minutes on 2 cores). What CI runs. Extra arguments go to the
# suite's pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/test.sh -m "slow or not slow" "$@"
bash scripts/test-newest.sh
