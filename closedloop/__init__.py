"""Closed-loop benchmark: does graphdiff make a real policy learn faster?

A small character-level Llama, warm-started by SFT, is trained with TRL's ``GRPOTrainer`` on verifiable
prompts generated in code (``tasks``); which prompts it trains on each step is decided by a scheduler
driven either by its native online estimator or by graphdiff (``schedulers``); one run is ``loop.run``,
the grid's aggregation (held-out accuracy vs steps and rollouts, exact sign test, plots) is ``report``.
Entry point: ``python -m closedloop`` from the repository root (the workflow's closedloop rules put the
root on PYTHONPATH). A benchmark beside ``bench/``, not part of the ``graphdiff_cli`` library: it uses
the library's public parts (Estimator, the TRL integration, core's baselines and decisions) and raises
``graphdiff_cli.errors`` so that its command line reports one line per error.
"""
