"""Trainer integrations: TRL (``integrations.trl``), verl (``integrations.verl``, ``verl_v1``), Trinity-RFT
(``trinity``), OpenRLHF (``openrlhf``), and the trainers that hand over one finished group at a time - prime-rl
(``prime_rl``), AReaL (``areal``), slime (``slime``), SkyRL (``skyrl``), NeMo-RL (``nemo_rl``) - over their shared
``groups``; with the shared pieces (``integrations.tracking``) that record a step's rollout outcomes, apply them
to a graphdiff estimator or STATE directory once per trainer step, and choose the next batch. Nothing here is
imported by the rest of the package; each module imports its trainer lazily, so ``import graphdiff_cli`` never
needs them."""
