"""``Estimator``: the Python API over the mean-field core (the contract other tools call).

    est = Estimator(graph, labels, n_states=K)                    # the default preset
    est = Estimator(graph, labels, n_states=K, preset="paper")    # Sections 3.4-3.6 exactly
    stats = est.update(ids, n, s)   # one training step
    p = est.predict(ids=None)       # p-hat for those node indices (all if None)
    est.save(path); est = Estimator.load(path)

The parts, each in its module: ``driver`` (``Estimator``: construction, the update and its commit, extend,
estimates, state_dict / from_state_dict, save / load), ``choices`` (the settings chosen online and their
scoreboard), ``propagation`` (label propagation's field and estimate), ``versions`` (migrations of saved
states of older encoding versions). The state's arrays are declared in ``io.estimator_layout``.
"""

from ..settings import EstimatorSettings, preset_settings
from .driver import Estimator

__all__ = ["Estimator", "EstimatorSettings", "preset_settings"]
