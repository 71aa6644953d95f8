#!/usr/bin/env bash
# Create or reuse .venv/ at the repository root and install graphdiff (the distribution graphdiff-rl) into it,
# editable, with the extras in GRAPHDIFF_EXTRAS (default: test, which brings the workflow's snakemake, the
# report's matplotlib and what the tests need).
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
# a .venv made before the rename holds this checkout installed as "graphdiff" (on the index that name is another
# project's); it would claim the same files as graphdiff-rl
if "$VPY" -m pip show graphdiff >/dev/null 2>&1; then
    "$VPY" -m pip uninstall -q -y --disable-pip-version-check graphdiff
fi
"$VPY" -m pip install -q --disable-pip-version-check -e ".[${extras}]"
echo "graphdiff installed in .venv ($(.venv/bin/graphdiff --version 2>/dev/null || echo 'cli not yet importable'))" >&2
