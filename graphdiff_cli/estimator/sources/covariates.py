"""The read-out of the prompts' covariates as a source (beyond the paper; ``core.covariates``): the embedding's
read-out (``sources.readout``) on other features - what the user's prompt file says of each prompt (text
statistics of the prompt and its answer, numeric and categorical fields, a reference model's pass rate), encoded
once by ``core.covariates`` - fitted online on every prompt with evidence.

Setting ``covariate_readout``: its weight in the mix (a number, "auto" over ``core.readout.READOUT_GRID``, or None:
off; off too without covariates); its ridge strength is ``readout_ridge``'s setting, chosen on a board of its own
(``covariate_errors``). Before any outcome it says each prompt's reference pass rate where it has one (a prompt
never rolled out starts from it) and the observed global rate elsewhere; from the first outcome on, the fit -
whose features include the reference rate, so the rate is calibrated to the policy being trained, not taken as
the policy's. Its state: the fit's sufficient statistics ``covariate_gram``, ``covariate_moment``.
"""

from __future__ import annotations

import numpy as np

from .base import global_rate
from .readout import Readout


class Covariates(Readout):
    name = "covariate_readout"
    arrays = ("covariate_gram", "covariate_moment", "covariate_errors")
    board = "covariate_errors"

    @staticmethod
    def matrix_of(inputs):
        x = None if inputs is None else inputs.covariates
        return x if x is not None and x.shape[1] else None

    @staticmethod
    def weight_of(settings):
        return settings.covariate_readout

    def matrix(self, est):
        return est.covariates

    def fill(self, est, rows):
        g = global_rate(est.global_counts_)
        ref = est.reference_rate
        if ref is None:
            return g
        r = ref[rows]
        return np.where(np.isnan(r), g, r)
