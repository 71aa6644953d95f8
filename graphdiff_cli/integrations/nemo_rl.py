"""graphdiff in NeMo-RL's synchronous GRPO loop, around its dynamic sampling step (``grpo.use_dynamic_sampling``).

NeMo-RL (checked at NVIDIA-NeMo/RL@7ea279a, nemo_rl/algorithms/grpo.py) has no sampler or outcome plugin
setting. Its ``grpo_train`` loop calls the module function ``dynamic_sampling(repeated_batch, std, baseline,
num_gen_batches, master_config, timer, batch_cache)`` on every generation batch - with
``grpo.use_dynamic_sampling`` it drops the groups whose reward std is 0 and returns ``is_batch_complete=False``
until ``num_prompts_per_step`` groups with signal are cached (DAPO); without it the batch passes unchanged and
is complete. ``repeated_batch`` holds one entry per rollout (``repeat_interleave`` of the prompts):
``idx`` (the row's data set index), ``extra_env_info`` (the row's dict from the data processor),
``total_reward`` and, under reward shaping, ``unshaped_total_reward`` (the raw task metric, the one NeMo-RL's
dynamic sampling filters on). ``install()`` replaces that module function by ``GraphdiffDynamicSampling``:

* every generation batch's groups are recorded (``groups.GroupSteps``) before NeMo-RL's own rule runs
  unchanged, so the groups it drops are outcomes too; the prompt id is ``extra_env_info[id_field]`` (default
  ``id``; put it there in the data processor), or the data set index with ``id_field: idx``; the reward is
  ``unshaped_total_reward`` when present, else ``total_reward``;
* when the batch is complete (NeMo-RL goes on to train) the step's groups are applied as the STATE's next step,
  and the ``graphdiff/...`` scalars join the step's logged metrics (the dynamic-sampling metrics dict).

Wiring: in the GRPO entry script (examples/run_grpo.py), before ``grpo_train``::

    from graphdiff_cli.integrations.nemo_rl import install
    install({"state": "runs/STATE"})

Unsupported: choosing which prompts NeMo-RL generates (its ``StatefulDataLoader`` is built inside ``setup`` with a
random or sequential sampler and no setting to replace it); async GRPO (``grpo.async_grpo.enabled``; NeMo-RL
refuses dynamic sampling there, and its replay buffer calls no such function); a resume check - the hook never
sees NeMo-RL's step counter, so a resumed run needs a STATE rolled back to the checkpoint's step (``graphdiff
rollback --to``) by hand.
"""

from __future__ import annotations

from ..errors import DataError, InvalidArgumentError
from .groups import GroupSteps, as_array, group_options, open_state
from .ids import trinity_id

WHERE = "graphdiff NeMo-RL option "


class GraphdiffDynamicSampling:
    """NeMo-RL's ``dynamic_sampling`` (``original``) with every generation batch's groups fed to a STATE."""

    def __init__(self, original, options=None, target=None):
        self.original = original
        self.options = group_options(dict(options or {}), lambda name: WHERE + name, need_state=target is None)
        self.target = open_state(self.options, target)
        self.steps = GroupSteps(self.target, success_threshold=self.options["success_threshold"])

    def __call__(self, repeated_batch, std, baseline, dynamic_sampling_num_gen_batches, master_config, timer,
                 batch_cache=None):
        for pid, rewards in self.groups(repeated_batch):
            self.steps.add(pid, rewards)
        out = self.original(repeated_batch, std, baseline, dynamic_sampling_num_gen_batches, master_config, timer,
                            batch_cache)
        if out[1]:  # is_batch_complete: NeMo-RL trains on this step now
            out[3].update(self.steps.apply())
        return out

    def groups(self, batch) -> list[tuple[str, list[float]]]:
        """(prompt id, rewards) per prompt of one generation batch, in order of first appearance."""
        key = "unshaped_total_reward" if "unshaped_total_reward" in batch else "total_reward"
        rewards = as_array(batch[key]).tolist()
        field = self.options["id_field"]
        if field == "idx":
            values = list(batch["idx"])
        else:
            infos = list(batch["extra_env_info"])
            missing = next((j for j, info in enumerate(infos) if not isinstance(info, dict) or field not in info), None)
            if missing is not None:
                raise DataError(f"rollout {missing} of NeMo-RL's batch has no extra_env_info[{field!r}]: return each "
                                f"prompt's id there from the data processor, or set {WHERE}id_field to idx")
            values = [info[field] for info in infos]
        if len(values) != len(rewards):
            raise DataError(f"NeMo-RL's batch has {len(values)} prompt ids for {len(rewards)} rewards")
        out: dict[str, list[float]] = {}
        for value, r in zip(values, rewards):
            out.setdefault(trinity_id(value), []).append(r)
        return list(out.items())


def install(options=None, module=None, target=None) -> GraphdiffDynamicSampling:
    """Replace ``nemo_rl.algorithms.grpo.dynamic_sampling`` (``module``: that module; tests pass their own) by
    graphdiff's wrapper around it; installing twice is refused."""
    if module is None:
        import nemo_rl.algorithms.grpo as module
    current = getattr(module, "dynamic_sampling", None)
    if current is None:
        raise InvalidArgumentError("this NeMo-RL has no nemo_rl.algorithms.grpo.dynamic_sampling to wrap")
    if isinstance(current, GraphdiffDynamicSampling):
        raise InvalidArgumentError("graphdiff is already installed in NeMo-RL's dynamic sampling")
    module.dynamic_sampling = GraphdiffDynamicSampling(current, options, target)
    return module.dynamic_sampling
