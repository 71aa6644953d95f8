"""graphdiff in slime's rollout through its function-path hooks (no subclass, no patch).

slime (checked at THUDM/slime@624b824) loads each ``--*-path`` flag's ``module.function`` with ``load_function``
and, in ``slime/rollout/sglang_rollout.py``'s training rollout (one rollout = one training step), calls:

* ``--dynamic-sampling-filter-path``: ``fn(args, group)`` for every completed group (``list[Sample]``, one
  sample per rollout of one prompt), whether it is then kept or dropped; the return is a
  ``DynamicFilterOutput`` (or a bool);
* ``--rollout-all-samples-process-path``: ``fn(args, all_samples, data_source)`` once at the end of the
  rollout, with every completed group, the filtered ones included;
* ``--buffer-filter-path`` (``slime/rollout/data_source.py``, ``RolloutDataSourceWithBuffer``): ``fn(args,
  rollout_id, buffer, num_samples)`` whenever the data source takes groups from its buffer (groups added back,
  e.g. partial rollouts); it returns up to ``num_samples`` groups and removes them from ``buffer``.

This module gives one function for each, sharing one STATE per process:

* ``dynamic_sampling_filter``: records the group's outcomes and keeps it when it has a GRPO signal (0 < s < n,
  success = reward >= ``success_threshold``; ``GRAPHDIFF_FILTER=false`` keeps every group and only records);
* ``all_samples_process``: applies the rollout's groups as exactly one STATE step - the groups the filter
  recorded, or, without graphdiff's filter, every group of ``all_samples`` - and writes the STATE step into the
  data source's metadata (saved with slime's rollout checkpoint); on the first call after a resume a STATE at
  another step is refused (``graphdiff rollback --to``);
* ``buffer_filter``: takes the ``num_samples`` buffered groups graphdiff's ``strategy`` prefers, from the
  current estimates (``core.decisions.select``).

Prompt id: ``sample.metadata[id_field]`` (the data set's ``--metadata-key`` column, default ``metadata``; put
the id there, e.g. ``{"metadata": {"id": "q17"}}``); reward: ``sample.get_reward_value(args)`` (``--reward-key``
respected). Options: environment variables only (slime passes its hooks nothing else): ``GRAPHDIFF_STATE``
(required), ``GRAPHDIFF_ID_FIELD`` (id), ``GRAPHDIFF_SUCCESS_THRESHOLD``, ``GRAPHDIFF_FILTER`` (true),
``GRAPHDIFF_STRATEGY`` / ``_TARGET`` / ``_EXPLORE`` / ``_SEED`` for the buffer choice, ``GRAPHDIFF_OUTCOMES_DIR``.

Unsupported: which fresh prompts slime reads from its data set (sequential, shuffled per epoch: choosing them
would need a ``--data-source-path`` class, not built here); evaluation rollouts (not passed to these hooks);
partial-rollout groups aborted at the end of a rollout are outcomes of no step (slime does not hand them to the
filter). slime is imported only for ``DynamicFilterOutput``; without it the filter returns a bool, which slime
also accepts.
"""

from __future__ import annotations

import numpy as np

from ..core import decisions as dec
from ..errors import DataError, StateError
from .groups import GroupSteps, group_options, open_state

FILTER_PATH = "graphdiff_cli.integrations.slime.dynamic_sampling_filter"
PROCESS_PATH = "graphdiff_cli.integrations.slime.all_samples_process"
BUFFER_PATH = "graphdiff_cli.integrations.slime.buffer_filter"
DROP_REASON = "graphdiff_zero_variance"  # logged by slime as rollout/dynamic_filter/drop_<reason>

_ADAPTERS: dict = {}


class SlimeAdapter:
    """One process's STATE and the current rollout's groups (``adapter()`` builds it from the environment)."""

    def __init__(self, options=None, target=None, environ=None):
        self.options = group_options(options, lambda name: "GRAPHDIFF_" + name.upper(), environ=environ,
                                     need_state=target is None)
        self.target = open_state(self.options, target)
        self.steps = GroupSteps(self.target, success_threshold=self.options["success_threshold"])
        self.checked = False  # the STATE step checked against the data source's metadata (once per process)
        self.buffer_reads = 0

    def prompt_id(self, group) -> str:
        """The prompt id of one slime group (``list[Sample]``; a nested group of lists is flattened)."""
        sample = _samples(group)[0]
        field = self.options["id_field"]
        metadata = getattr(sample, "metadata", None) or {}
        if field not in metadata:
            raise DataError(f"slime sample {getattr(sample, 'index', '?')} has no metadata[{field!r}]: put each "
                            f"prompt's id in the data set's metadata column ({{\"metadata\": {{\"{field}\": ...}}}})")
        return str(metadata[field])

    def group(self, args, group) -> tuple[str, list[float]]:
        """(prompt id, rewards) of one finished slime group."""
        return self.prompt_id(group), [float(s.get_reward_value(args)) for s in _samples(group)]

    def filter(self, args, group) -> bool:
        signal = self.steps.add(*self.group(args, group))
        return signal or not self.options["filter"]

    def close_rollout(self, args, all_samples, data_source) -> dict[str, float]:
        meta = data_source.get_metadata() if hasattr(data_source, "get_metadata") else {}
        if not self.checked and "graphdiff_step" in meta and int(meta["graphdiff_step"]) != self.target.step:
            want = int(meta["graphdiff_step"])
            self.steps.rows, self.steps.groups, self.steps.dropped = [], 0, 0  # recorded against the wrong STATE
            raise StateError(f"the graphdiff STATE is at step {self.target.step} but slime's rollout checkpoint "
                             f"recorded step {want}: graphdiff rollback --to {want}, or use the STATE this run "
                             "was checkpointed with")
        self.checked = True
        if getattr(args, "dynamic_sampling_filter_path", None) != FILTER_PATH:
            for group in all_samples:  # no graphdiff filter saw them: record every completed group here
                self.steps.add(*self.group(args, group))
        metrics = self.steps.apply()
        if hasattr(data_source, "update_metadata"):
            data_source.update_metadata({"graphdiff_step": int(self.target.step)})
        return metrics

    def take(self, args, rollout_id, buffer: list, num_samples: int) -> list:
        k = min(len(buffer), int(num_samples))
        if k == len(buffer):
            taken = list(buffer)
        else:
            ids = [self.prompt_id(g) for g in buffer]
            n = int(getattr(args, "n_samples_per_prompt", None) or self.options["group_size"])
            est = self.target.estimates(self.target.nodes(ids, "buffered groups' ids"), n)
            o = self.options
            sel = dec.select(o["strategy"], k, p=est["mean"], variance=est["variance"],
                             p_zero_variance=est["p_zero_variance"], target=o["target"], explore=o["explore"],
                             seed=[o["seed"], self.buffer_reads])
            taken = [buffer[int(i)] for i in np.sort(sel.chosen)]
        self.buffer_reads += 1
        keep = {id(g) for g in taken}
        buffer[:] = [g for g in buffer if id(g) not in keep]
        return taken


def _samples(group) -> list:
    samples = [s for item in group for s in (item if isinstance(item, list) else [item])]
    if not samples:
        raise DataError("slime passed an empty group")
    return samples


def adapter(environ=None) -> SlimeAdapter:
    """This process's adapter for the ``GRAPHDIFF_STATE`` of the environment (built on first use)."""
    opts = group_options(None, lambda name: "GRAPHDIFF_" + name.upper(), environ=environ)
    key = (str(opts["state"]), str(opts["outcomes_dir"]))
    if key not in _ADAPTERS:
        _ADAPTERS[key] = SlimeAdapter(environ=environ)
    return _ADAPTERS[key]


def _output(keep: bool):
    try:
        from slime.rollout.filter_hub.base_types import DynamicFilterOutput
    except Exception:  # noqa: BLE001 - slime absent: a bool, which slime's call_dynamic_filter also accepts
        return keep
    return DynamicFilterOutput(keep=keep, reason=None if keep else DROP_REASON)


def dynamic_sampling_filter(args, samples, **kwargs):
    """``--dynamic-sampling-filter-path``: record the group, keep it when it has a GRPO signal."""
    return _output(adapter().filter(args, samples))


def all_samples_process(args, all_samples, data_source) -> None:
    """``--rollout-all-samples-process-path``: apply the rollout's groups as one STATE step."""
    adapter().close_rollout(args, all_samples, data_source)


def buffer_filter(args, rollout_id, buffer, num_samples):
    """``--buffer-filter-path``: take the ``num_samples`` buffered groups graphdiff's rule prefers."""
    return adapter().take(args, rollout_id, buffer, num_samples)
