#!/usr/bin/env bash
# The fresh-process loading tests on the newest transformers release PyPI serves (pre-releases included):
# checkpoints saved with the tested transformers (.venv, made by scripts/test.sh) must load and compute the same
# there. The newest release goes into a venv of its own (.venv-newest), beside the pinned CPU torch.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/pytest ]; then
  echo "run scripts/test.sh first (it makes .venv)" >&2
  exit 2
fi
python3 -m venv .venv-newest
.venv-newest/bin/pip install -q torch==2.13.0
.venv-newest/bin/pip install -q --pre --upgrade transformers
version=$(.venv-newest/bin/python -c "import transformers; print(transformers.__version__)")
echo "newest transformers on PyPI: $version (tested: $(.venv/bin/python -c 'import transformers; print(transformers.__version__)'))"
export PAPA_NEWEST_PYTHON="$PWD/.venv-newest/bin/python"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
.venv/bin/pytest -q -p no:cacheprovider -rs tests/test_newest.py "$@"
