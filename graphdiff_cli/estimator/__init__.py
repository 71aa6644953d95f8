"""``Estimator``: the Python API over the mean-field core (the contract other tools call).

    est = Estimator(graph, labels, n_states=K)                    # the default preset
    est = Estimator(graph, labels, n_states=K, preset="paper")    # Sections 3.4-3.6 exactly
    stats = est.update(ids, n, s)   # one training step
    p = est.predict(ids=None)       # p-hat for those node indices (all if None)
    est.save(path); est = Estimator.load(path)

The parts, each in its module:

- ``driver``: ``Estimator`` - the mean-field model (q, the states' posteriors, the prompts' counts: the evidence
  every source reads), the update and its all-or-nothing commit, extend, estimates, state_dict /
  from_state_dict, save / load;
- ``sources``: one class per source of the graph's estimate behind one protocol (``Source``: its state
  arrays, ``observe(step)``, ``estimate(rows)`` -> (mean, spread), ``grow``, its weight's candidates and
  start, boards of its own): ``States`` (the mean-field states, the paper's part and the base), ``Propagation``
  (label propagation), ``Readout`` (the ridge read-out of the embedding); ``SOURCES`` is the list an
  estimator blends; ``History``, the prompt's own outcomes, is the last mixing step (kappa, nu, time
  forgetting);
- ``mix``: ``Mix``, the one combinator over the list - m_0 = the states', m_j = (1 - w_j) m_{j-1} + w_j
  source_j, then the history - and its one scoreboard of online choices (time forgetting, w_1..w_J, kappa);
- ``versions``: migrations of saved states of older encoding versions.

The state's arrays are declared in ``io.estimator_layout``. A new source is one class in ``sources`` and
one entry in ``SOURCES`` (or in a subclass's ``Estimator.SOURCES``); the driver does not change.
"""

from ..settings import EstimatorSettings, preset_settings
from .driver import Estimator

__all__ = ["Estimator", "EstimatorSettings", "preset_settings"]
