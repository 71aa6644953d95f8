"""graphdiff as a prime-rl curriculum ``TaskSampler`` (``prime_rl.orchestrator.curriculum``).

prime-rl (checked at PrimeIntellect-ai/prime-rl@559b447, with verifiers@a60a606 for ``verifiers.v1``) gives each
training env a ``Curriculum``: one ``TaskSampler`` and any number of ``AdmissionGate``s. Its ``TrainSource``
asks ``next(curriculum.sampler)`` for every task it rolls out, and for every finalized group calls
``Curriculum.on_result(group)``, which first calls ``sampler.observe(group)`` - for every group, admitted by the
gates or not - and then the gates. The sampler's ``state_dict``/``load_state_dict`` go into the orchestrator's
checkpoint, its ``metrics()`` to the logger under ``curriculum/<env>/sampler/``. This sampler:

* ``__next__``: the next task of a block of ``groups_per_step`` tasks (one training step's prompts), chosen
  from a pool of ``pool_factor`` x that by ``strategy`` from the estimates as they are when the block starts
  (``groups.ChosenRows``);
* ``observe(group)``: the group's prompt id is its task's: ``task.key`` (prime-rl's own task identity; ``id_field:
  key``, the default), or a field of the task's data (``id_field: info.id`` reads ``task.data.info["id"]``);
  the rewards are each trace's ``reward`` over the traces without error of trainable agents (the traces
  ``DifficultyPoolSampler`` reads); once ``groups_per_step`` groups are in, they are applied as one STATE step
  (``groups.GroupSteps``);
* ``state_dict``: the STATE step, the groups not applied yet and the block being handed out;
  ``load_state_dict`` refuses a STATE that is not at the saved step (``graphdiff rollback --to``).

Wiring: prime-rl builds only its own sampler configs (``standard``, ``difficulty_pool``) from
``[orchestrator.train.source.curriculum.sampler]``; there is no class-path setting, so the sampler is put in
place after the ``TrainSource`` is built: ``install(train_source, env_name, state=..., groups_per_step=...)``.
Keep ``[...curriculum.gates.*]`` as they are: prime-rl's ``AdvRangeGate`` is DAPO's zero-variance filter, and
the groups it rejects still reach ``observe``.

Unsupported: infinite task streams (the sampler needs the finite taskset to choose from); the STATE step is a
count of ``groups_per_step`` observed groups, not prime-rl's trainer step (prime-rl is asynchronous: a group
observed at step t may have been chosen, and rolled out, under an older policy; ``max_async_level`` bounds how
much older). prime-rl is imported only for its ``TaskSampler`` base class; without prime-rl the sampler is a
plain iterator with the same methods.
"""

from __future__ import annotations

from ..errors import DataError, InvalidArgumentError
from ..io.tables import field_value
from .groups import ChosenRows, GroupSteps, group_options, open_state
from .ids import row_prompt_ids, trinity_id

try:
    from prime_rl.orchestrator.curriculum.samplers.base import TaskSampler as _Base
except Exception:  # noqa: BLE001 - prime-rl (or verifiers) absent: the same methods on a plain base
    _Base = object

WHERE = "graphdiff prime-rl option "


def task_id(task, id_field: str = "key"):
    """A task's prompt id value: ``task.key``, or the ``id_field`` of its data (a dotted path; None if absent)."""
    if id_field == "key":
        return task.key
    data = task.data
    if hasattr(data, "model_dump"):  # verifiers' task data is a pydantic model
        data = data.model_dump()
    return field_value(data, id_field)[1] if isinstance(data, dict) else getattr(data, id_field, None)


class GraphdiffTaskSampler(_Base):
    """A prime-rl ``TaskSampler`` driven by a graphdiff STATE (see the module docstring). ``options``: the
    ``groups.OPTIONS`` (``state`` and ``groups_per_step`` required; ``id_field`` defaults to ``key``);
    ``target``: an Estimator/Target instead of ``state`` (tests)."""

    def __init__(self, tasks, options=None, target=None):
        options = {"id_field": "key", **dict(options or {})}
        opts = group_options(options, lambda name: WHERE + name, need_state=target is None)
        if opts["groups_per_step"] is None:
            raise InvalidArgumentError(f"set {WHERE}groups_per_step to the groups of one training step "
                                       "(orchestrator batch size / rollouts per example)")
        if not hasattr(tasks, "__len__") or not hasattr(tasks, "__getitem__"):
            raise InvalidArgumentError("graphdiff's prime-rl sampler needs a finite taskset (a sequence of tasks), "
                                       "not a stream: it chooses among all tasks")
        self.tasks = tuple(tasks)
        self.target = open_state(opts, target)
        self.options = opts
        self.id_field = opts["id_field"]
        self.ids = row_prompt_ids((task_id(t, self.id_field) for t in self.tasks), trinity_id, rows="taskset",
                                  field=repr(self.id_field), shared=f"the id {{id}} ({self.id_field})",
                                  missing="every task needs a stable prompt id")
        if not self.ids:
            raise DataError("the taskset has no tasks")
        self.by_key = {t.key: pid for t, pid in zip(self.tasks, self.ids)}
        self.rows = ChosenRows(self.target, self.ids, opts["groups_per_step"], opts, "taskset ids")
        self.steps = GroupSteps(self.target, success_threshold=opts["success_threshold"],
                                groups_per_step=opts["groups_per_step"])

    # -- what prime-rl calls ---------------------------------------------------------------------------

    def __iter__(self):
        return self

    def __next__(self):
        return self.tasks[self.rows.next()]

    def observe(self, group) -> None:
        if not group:
            raise DataError("prime-rl reported an empty group")
        key = group[0].task.key
        pid = self.by_key.get(key)
        if pid is None:
            raise DataError(f"prime-rl reported a group of task key {key!r}, not a task of this taskset")
        rewards = [trace.reward for episode in group for trace in episode.traces
                   if not trace.has_error and trace.agent.trainable]
        if rewards:  # a group whose every trace failed is no outcome (as DifficultyPoolSampler skips it)
            self.steps.add(pid, rewards)

    def state_dict(self) -> dict:
        return {**self.steps.state_dict(), "rows": self.rows.state_dict()}

    def load_state_dict(self, state_dict) -> None:
        self.steps.load_state_dict(state_dict, "prime-rl's checkpoint")
        self.rows.load_state_dict(state_dict.get("rows", {}))

    def metrics(self) -> dict[str, float]:
        """The last STATE step's scalars, named relative to the sampler's namespace."""
        return {k.removeprefix("graphdiff/"): v for k, v in self.steps.metrics.items()}


def install(train_source, env_name: str, **options) -> GraphdiffTaskSampler:
    """Replace the task sampler of ``train_source.curricula[env_name]`` (a built prime-rl ``TrainSource``) by
    graphdiff's, over the same tasks; call it before the orchestrator loads its checkpoint."""
    curricula = getattr(train_source, "curricula", None)
    if not isinstance(curricula, dict) or env_name not in curricula:
        raise InvalidArgumentError(f"no training env {env_name!r} in the TrainSource (envs: "
                                   f"{', '.join(curricula or {}) or 'none'})")
    curriculum = curricula[env_name]
    tasks = getattr(curriculum.sampler, "tasks", None)
    if tasks is None:
        raise InvalidArgumentError(f"the env {env_name!r} streams its tasks; graphdiff's sampler needs a finite "
                                   "taskset")
    curriculum.sampler = GraphdiffTaskSampler(tasks, options)
    return curriculum.sampler
