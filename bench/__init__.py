"""The maintained benchmarks behind the figures of docs/ (bench/README.md lists them). Each is a script run by
path (``python bench/x.py``); what they share lives in ``bench/common.py``. A package only so that import-linter
can check them (pyproject.toml's [tool.importlinter]): not installed, not part of graphdiff."""
