"""Snakemake script: the --config file of one graphdiff evaluate run.

Section ``estimator``: beta, gamma and window from the wildcards (the grid varies them), the other
estimator settings from the workflow config; ``evaluate.settings``: the baselines' settings (the
workflow config's own shape, which graphdiff evaluate --config reads).
"""

from pathlib import Path

import yaml

sm = snakemake  # noqa: F821 - injected by Snakemake's script directive

est = dict(sm.params.estimator, beta=float(sm.wildcards.beta), gamma=float(sm.wildcards.gamma),
           window=None if sm.wildcards.window == "cum" else int(sm.wildcards.window))
text = yaml.safe_dump({"estimator": est, "evaluate": {"settings": dict(sm.params.evaluate)}}, sort_keys=True)
Path(sm.output[0]).write_text(text, encoding="utf-8")
Path(sm.log[0]).write_text(text, encoding="utf-8")
