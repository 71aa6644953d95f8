"""The sources of the graph's estimate, one class each (``Source``, the protocol: ``sources.base``).

``SOURCES`` is the list an ``Estimator`` blends, in order (the first the base): the mean-field states (the
paper's part), label propagation, the read-out of the embedding, the read-out of the covariates; each is on or off by its setting, an off one
keeping its axis of one value on the mix's board. The paper preset leaves every source but the states off. A
new source is one class here and one entry in ``SOURCES`` (or in an ``Estimator`` subclass's ``SOURCES``). The
prompt's own history (``History``) is the mix's last step, not a source.
"""

from .base import NO_CONTEXT, NO_INPUTS, Context, Inputs, Source, Step, global_rate
from .covariates import Covariates
from .history import History
from .live import Live
from .propagation import Propagation
from .readout import Readout
from .states import States

SOURCES = (States, Propagation, Readout, Covariates, Live)

__all__ = ["NO_CONTEXT", "NO_INPUTS", "SOURCES", "Context", "Covariates", "History", "Inputs", "Live", "Propagation",
           "Readout", "Source", "States", "Step", "global_rate"]
