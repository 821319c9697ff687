#!/usr/bin/env bash
# Every test tier: the fast tier and the slow one (torch.compile, ONNX, torchrun/accelerate, extra fresh-process
# loads, the real MiniLM weights). What CI runs. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
exec bash scripts/test.sh -m "slow or not slow" "$@"
