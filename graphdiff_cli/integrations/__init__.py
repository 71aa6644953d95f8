"""Trainer integrations: TRL (``integrations.trl``), verl (``integrations.verl``), and the shared pieces
(``integrations.tracking``) that record a step's rollout outcomes, apply them to a graphdiff estimator or
STATE directory once per trainer step, and choose the next batch. Nothing here is imported by the rest
of the package; each module imports its trainer lazily, so ``import graphdiff_cli`` never needs them."""
