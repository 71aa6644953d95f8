"""How closely tests compare floating-point results computed by numerical code (numpy, scipy, BLAS, torch).

A computed float is reproducible bit for bit only within one machine, one process and one code path: another
BLAS kernel (OpenBLAS picks one per CPU; OPENBLAS_CORETYPE), another thread count (OMP_NUM_THREADS), another SIMD
width for numpy's and torch's own loops (NPY_DISABLE_CPU_FEATURES, ATEN_CPU_CAPABILITY) or another way to the
same sum re-orders the arithmetic and moves the last bits. Tests compare exactly only what is exact by
construction (integers, counts, ids, copies, a save/load round trip of the same arrays, one code path run again
on the same inputs in the same process); any other comparison of computed floats takes one of these, each
derived from what the computation guarantees and each far below what a wrong formula moves (1e-3 or more).
"""

from __future__ import annotations

import numpy as np

# float64 arithmetic on the same inputs, re-ordered (BLAS kernel, threads, SIMD width, another path to the same
# sums): a few ulp per operation, n ulp (n * 1.1e-16 relative) for a sum of n terms; the values compared (the
# estimator's probabilities and variances in [0, 1], evidence counts up to ~1e2) stay far inside this
FLOAT64 = {"rtol": 1e-12, "atol": 1e-12}

# the estimator's update computed on another machine or along another path: q is float32 by default (eps
# 1.2e-7) through a step's mean-field rounds, and label propagation's field is a CG solve to a relative
# residual of 1e-5 (its effect on the estimates measured at ~1e-7, tests/test_estimator_versions.py), so the
# estimates agree to a few float32 ulp of values in [0, 1]
UPDATE = {"rtol": 0, "atol": 1e-6}


def float32_dot_error(d: int) -> float:
    """The most two float32 inner products of the same unit vectors of dimension ``d`` can differ by when
    summed in different orders (another BLAS kernel or SIMD width: faiss, sgemm): d roundings of 2^-24 each."""
    return 2 * d * 2.0 ** -24


def assert_same_neighbours(nbr, ref_nbr, ref_sim, tol: float) -> None:
    """Each row lists the same neighbours in the same order, except that neighbours whose similarities (in
    ``ref_sim``, most similar first) lie within ``tol`` of each other may come in either order: their order is
    decided by the last bits of float32 inner products, which another BLAS kernel or SIMD width rounds otherwise."""
    nbr, ref_nbr, ref_sim = np.asarray(nbr), np.asarray(ref_nbr), np.asarray(ref_sim, dtype=np.float64)
    assert nbr.shape == ref_nbr.shape
    for i in range(nbr.shape[0]):
        block = np.r_[0, np.cumsum(ref_sim[i, :-1] - ref_sim[i, 1:] > tol)]  # runs of near-tied similarities
        for b in np.unique(block):
            run = block == b
            assert sorted(nbr[i, run].tolist()) == sorted(ref_nbr[i, run].tolist()), (i, nbr[i], ref_nbr[i])


# a float32 network's outputs for the same input computed in another batch (left padding, another kernel's order
# of the same sums): a few float32 ulp (1.2e-7) per operation through its layers, so probabilities and entropies
# (of order 1 to log V) agree to ~1e-6; a wrong position or a softmax over the wrong axis moves them by 1e-2 or more
FLOAT32_NETWORK = {"rtol": 1e-5, "atol": 1e-5}
