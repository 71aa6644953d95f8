#!/usr/bin/env bash
# Runs once inside the new conda environment (CONDA_PREFIX set), in snakemake's working directory:
# install graphdiff from that repository (GRAPHDIFF_SRC overrides), without touching its dependencies.
set -euo pipefail
src="${GRAPHDIFF_SRC:-$PWD}"
if [ ! -f "$src/pyproject.toml" ] || [ ! -d "$src/graphdiff_cli" ]; then
    echo "graphdiff post-deploy: $src is not the graphdiff repository; run snakemake from it or set GRAPHDIFF_SRC" >&2
    exit 1
fi
python -m pip install --no-deps --no-build-isolation "$src"
