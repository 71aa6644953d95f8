#!/usr/bin/env bash
# Create or reuse .venv/ at the repository root and install graphdiff into it.
# Safe to run repeatedly: a second run only checks that everything is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
VPY=.venv/bin/python
# torch first, pinned: on CPU-only machines of this kind `torch==2.13.0` is a CPU wheel already on disk,
# whereas an unpinned `torch` requirement would pull a multi-GB CUDA build from the index.
if ! "$VPY" -c "import torch" >/dev/null 2>&1; then
    "$VPY" -m pip install -q --disable-pip-version-check "torch==${GRAPHDIFF_TORCH_VERSION:-2.13.0}"
fi
extras=${GRAPHDIFF_EXTRAS:-test}
"$VPY" -m pip install -q --disable-pip-version-check -e ".[${extras}]"
echo "graphdiff installed in .venv ($(.venv/bin/graphdiff --version 2>/dev/null || echo 'cli not yet importable'))" >&2
