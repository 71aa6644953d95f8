"""The peers that read only what the user already knows of each prompt (the covariates' read-out alone, BOTS's
prior from a reference pass rate), the calibration of P(all-same group), and evaluate's --covariates."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from _tolerances import FLOAT64
from graphdiff_cli.cli.app import app
from graphdiff_cli.core.covariates import Raw, encode, make_spec, text_statistics
from graphdiff_cli.core.graph import exact_knn, mutual_knn_graph
from graphdiff_cli.core.spectral import spectral_clustering
from graphdiff_cli.errors import DataError, InvalidArgumentError
from graphdiff_cli.estimator import Estimator
from graphdiff_cli.evaluation import methods
from graphdiff_cli.evaluation.baselines import BOTS_SETTINGS, CovariateReadout, ReferencePrior
from graphdiff_cli.evaluation.metrics import score_rows, zero_variance_ece
from graphdiff_cli.io.artifacts import write_artifact
from _worlds import topic_world

runner = CliRunner()


def _steps(n_nodes, steps, batch, seed):
    """A random log: each step a batch of prompts (one listed twice), 8 rollouts each."""
    rng = np.random.default_rng(seed)
    p = rng.uniform(0.05, 0.95, n_nodes)
    out = []
    for _ in range(steps):
        ids = rng.choice(n_nodes, batch, replace=False)
        ids = np.r_[ids, ids[:1]]
        n = np.full(ids.size, 8)
        out.append((ids, n, rng.binomial(n, p[ids])))
    return out


# ------------------------------------------------------------------------------------------------ reference


def _bots_brute_force(reference, log, m, lamb, rho, discount):
    """BOTS's InterpolationBetaPREstimator on one reference column (anchors 0 and the rate), prompt by prompt."""
    n_nodes = reference.size
    alpha, beta = [1.0] * n_nodes, [1.0] * n_nodes
    cap, succ, rolls = None, 0, 0
    preds = []
    for ids, n, s in log:
        preds.append([alpha[i] / (alpha[i] + beta[i]) for i in range(n_nodes)])
        counts = {}
        for i, a, b in zip(ids.tolist(), n.tolist(), s.tolist()):
            c = counts.setdefault(i, [0, 0])
            c[0] += a
            c[1] += b
        succ += int(s.sum())
        rolls += int(n.sum())
        g = succ / rolls
        rate = {i: c[1] / c[0] for i, c in counts.items()}
        with_ref = [i for i in rate if not np.isnan(reference[i])]
        if with_ref:
            c_step = (sum(rate[i] for i in with_ref) / len(with_ref)) / \
                (sum(reference[i] for i in with_ref) / len(with_ref) + 1e-6)
            cap = c_step if cap is None else discount * cap + (1 - discount) * c_step
        for i in range(n_nodes):
            if i in rate:
                pt, sb, fb = rate[i], m * rate[i], m * (1 - rate[i])
            else:
                pt = g if cap is None or np.isnan(reference[i]) else min(max(cap * reference[i], 0.0), 1.0)
                sb = fb = 0.0
            alpha[i] = (1 - lamb) * alpha[i] + lamb + (1 - rho) * sb + rho * m * pt
            beta[i] = (1 - lamb) * beta[i] + lamb + (1 - rho) * fb + rho * m * (1 - pt)
    preds.append([alpha[i] / (alpha[i] + beta[i]) for i in range(n_nodes)])
    return np.array(preds), np.array(alpha), np.array(beta)


def test_reference_prior_is_bots_rule_computed_by_brute_force():
    rng = np.random.default_rng(3)
    ref = rng.uniform(0, 1, 40)
    ref[rng.choice(40, 9, replace=False)] = np.nan  # prompts without a reference rate
    log = _steps(40, 12, 7, seed=4)
    peer = ReferencePrior(ref, **BOTS_SETTINGS)
    got = []
    for ids, n, s in log:
        got.append(peer.predict(np.arange(40)))
        peer.update(ids, n, s)
    got.append(peer.predict(np.arange(40)))
    want, alpha, beta = _bots_brute_force(ref, log, **BOTS_SETTINGS)
    np.testing.assert_allclose(np.array(got), want, **FLOAT64)
    np.testing.assert_allclose(peer.alpha_, alpha, **FLOAT64)
    np.testing.assert_allclose(peer.beta_, beta, **FLOAT64)
    # the Beta it keeps is its belief: mean p, a variance, a Beta-Binomial P(all-same)
    est = peer.estimates(np.arange(40), 8)
    assert set(est) == {"p", "variance", "p_zero_variance"}
    assert np.all((est["p_zero_variance"] > 0) & (est["p_zero_variance"] < 1))


def test_reference_prior_follows_the_rate_for_prompts_never_selected():
    """An unselected prompt's estimate moves toward capability x its rate: the ranking is the reference's."""
    ref = np.linspace(0.1, 0.9, 30)
    peer = ReferencePrior(ref)
    rng = np.random.default_rng(1)
    for _ in range(40):  # only prompts 0-9 are ever rolled out; the policy solves half of what the reference does
        ids = rng.choice(10, 5, replace=False)
        peer.update(ids, np.full(5, 8), rng.binomial(8, 0.5 * ref[ids]))
    assert 0.3 < peer.capability_ < 0.7
    p = peer.predict(np.arange(10, 30))
    assert np.all(np.diff(p) > 0)
    np.testing.assert_allclose(p, peer.capability_ * ref[10:], atol=0.05)


def test_reference_prior_refuses_bad_inputs():
    with pytest.raises(DataError, match="reference pass rate"):
        ReferencePrior(np.array([0.2, 1.5]))
    with pytest.raises(InvalidArgumentError, match="rho"):
        ReferencePrior(np.array([0.2, 0.5]), rho=2.0)


# ------------------------------------------------------------------------------------------------ covariates


def _covariates(n_nodes, seed):
    rng = np.random.default_rng(seed)
    prompts = [" ".join(["x"] * int(rng.integers(3, 40))) + " $" * int(rng.integers(0, 5)) for _ in range(n_nodes)]
    answers = [str(int(rng.integers(-50, 5000))) if rng.random() < 0.7 else "\\frac{1}{2}" for _ in range(n_nodes)]
    raw = {k: Raw("text", v) for k, v in text_statistics(prompts, answers).items()}
    rate = [None if rng.random() < 0.3 else float(rng.uniform(0, 1)) for _ in range(n_nodes)]
    raw["reference"] = Raw("reference", rate)
    return encode(make_spec(raw), raw, n_nodes)


def test_the_covariates_peer_is_graphdiffs_covariates_source_alone():
    """Fed the same outcomes, the peer's read-out is the estimator's covariates source's, before any outcome (the
    reference rate where a prompt has one) and after every step (the same ridge fit), at every ridge strength."""
    n_nodes = 30
    enc = _covariates(n_nodes, seed=2)
    x = np.random.default_rng(0).standard_normal((n_nodes, 4))
    nbr, sim = exact_knn(x / np.linalg.norm(x, axis=1, keepdims=True), 5)
    w = mutual_knn_graph(nbr, sim)
    labels = spectral_clustering(w, 3, seed=0, fallback_neighbors=nbr)
    # the paper preset forgets nothing: the source's counts are the raw counts the peer keeps
    est = Estimator(w, labels, 3, preset="paper", covariates=enc.features, reference_rate=enc.reference,
                    covariate_readout=1.0, device="cpu")
    src = est.mix.source("covariate_readout")
    peer = CovariateReadout(enc.features, enc.reference)
    rows = np.arange(n_nodes)
    has = ~np.isnan(enc.reference)
    np.testing.assert_allclose(peer._readout(rows, 10.0)[has], enc.reference[has], **FLOAT64)
    np.testing.assert_allclose(src.fits(est, rows, [10.0])[0][has], enc.reference[has], **FLOAT64)
    for ids, n, s in _steps(n_nodes, 6, 8, seed=5):
        est.update(ids, n, s)
        peer.update(ids, n, s)
        for ridge in (1.0, 10.0, 100.0):
            np.testing.assert_allclose(peer._readout(rows, ridge), src.fits(est, rows, [ridge])[0], **FLOAT64)


def test_the_covariates_peer_refuses_bad_covariates():
    with pytest.raises(DataError, match="NaN"):
        CovariateReadout(np.array([[0.0], [np.nan]]))
    with pytest.raises(DataError, match="reference rate"):
        CovariateReadout(np.zeros((2, 1)), np.array([0.5]))


def test_the_registry_gives_the_covariate_methods_the_covariates_or_refuses_them():
    assert methods.COVARIATE_METHODS == ("covariates", "reference")
    cfg = methods.load_config(None)
    enc = _covariates(6, seed=1)
    w = mutual_knn_graph(*exact_knn(np.eye(6)[:, :3] + 0.1, 2))
    with pytest.raises(InvalidArgumentError, match="covariates"):
        methods.build_methods(["covariates"], cfg, w, np.zeros(6, int), 1, None, 6)
    got = methods.method_factories(["history", "covariates", "reference"], cfg, w, np.zeros(6, int), 1, None, 6)
    assert list(got) == ["history"]  # left out without covariates
    built, described = methods.build_methods(["covariates", "reference"], cfg, w, np.zeros(6, int), 1, None, 6,
                                             covariates=enc.features, reference=enc.reference)
    assert [m.name for m in built] == ["covariates", "reference"]
    np.testing.assert_array_equal(built[1].reference, enc.reference)
    with pytest.raises(InvalidArgumentError, match="reference pass rate"):
        methods.build_methods(["reference"], cfg, w, np.zeros(6, int), 1, None, 6, covariates=enc.features)


# ------------------------------------------------------------------------------------------------ calibration


def test_zero_variance_ece_against_a_hand_computation():
    score = np.array([0.05, 0.15, 0.95, 0.9])
    n = np.array([4, 4, 4, 4])
    s = np.array([0, 2, 4, 1])  # all-same: yes, no, yes, no
    # bins: [0, .1) holds 0.05 (outcome 1): |.05 - 1|; [.1, .2) holds 0.15 (0): .15; [.9, 1] holds .95 and .9
    # (mean .925, outcomes 1 and 0: mean .5): .425 on two rows
    want = (0.95 + 0.15 + 2 * 0.425) / 4
    assert zero_variance_ece(score, n, s) == pytest.approx(want, rel=1e-12)
    row = score_rows(np.array([1, 1, 2, 2]), np.full(4, 0.5), n, s, zero_var=score)
    assert row["zero_variance_ece"] == pytest.approx(want, rel=1e-12)
    assert np.isnan(score_rows(np.array([1, 1, 2, 2]), np.full(4, 0.5), n, s)["zero_variance_ece"])


# ------------------------------------------------------------------------------------------------ evaluate


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A simulated log over 60 prompts, its artifacts, and a second embeddings artifact holding covariates."""
    d = tmp_path_factory.mktemp("covworld")
    made = topic_world(d, n_prompts=60, steps=8, batch_size=20, seed=7, k=4)
    sim = made["sim"]
    # the same embeddings with covariates beside them (as embed writes them: the content hash is the embeddings')
    raw = {"level": Raw("numeric", [p["level"] for p in sim.prompts]),
           "rate": Raw("reference", [None if i % 4 == 0 else 0.1 * p["level"] for i, p in enumerate(sim.prompts)])}
    spec = make_spec(raw)
    enc = encode(spec, raw, 60)
    write_artifact(d / "emb_cov.zarr", "embeddings", {"ids": made["ids"], "embeddings": made["x"].astype(np.float32),
                                                      "covariates": enc.features, "reference_rate": enc.reference},
                   content_hash=made["emb_hash"], attrs={"covariate_spec": spec.as_dict()})
    (d / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in sim.log_rows()))
    return {"dir": d, "enc": enc}


def _eval(world, out, *extra):
    d = world["dir"]
    return runner.invoke(app, [str(a) for a in ("evaluate", "--log", d / "log.jsonl", "--graph", d / "graph.zarr",
                                                "--clusters", d / "clusters.zarr", "--out", out, "--device", "cpu",
                                                "--no-counterfactual", "--json", *extra)])


def test_evaluate_lists_the_covariate_peers_and_gives_graphdiff_the_covariates(world, tmp_path):
    d = world["dir"]
    res = _eval(world, tmp_path / "r", "--embeddings", d / "emb.zarr", "--covariates", d / "emb_cov.zarr",
                "--methods", "graphdiff,ridge,covariates,reference")
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    assert summary["methods"] == ["graphdiff", "ridge", "covariates", "reference"]
    assert summary["covariates"] == {"path": str(d / "emb_cov.zarr"), "features": world["enc"].features.shape[1],
                                     "reference_rate": True}
    assert summary["skipped"] == {}
    md = (tmp_path / "r" / "report.md").read_text()
    assert "| covariates |" in md and "| reference |" in md
    assert "Calibration of P(all-same group)" in md
    doc = json.loads((tmp_path / "r" / "metrics.json").read_text())
    assert doc["settings"]["graphdiff"]["covariates"] == world["enc"].features.shape[1]
    zv = doc["metrics"]["methods"]["reference"]["phases"]["full"]["all"]["zero_variance_ece"]
    assert 0 <= zv <= 1


def test_evaluate_skips_the_covariate_peers_with_a_reason_without_covariates(world, tmp_path):
    d = world["dir"]
    res = _eval(world, tmp_path / "r", "--embeddings", d / "emb.zarr", "--methods", "all")
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    assert "covariates" not in summary["methods"] and "reference" not in summary["methods"]
    assert set(summary["skipped"]) == {"covariates", "reference"}
    assert "--embeddings holds none" in summary["skipped"]["covariates"]
    md = (tmp_path / "r" / "report.md").read_text()
    assert "Not compared on this log: covariates (no covariates: --embeddings holds none" in md
    # named without covariates: refused in one line, nothing written
    res = _eval(world, tmp_path / "named", "--embeddings", d / "emb.zarr", "--methods", "history,covariates")
    assert res.exit_code != 0 and "needs the prompts' covariates" in res.output
    assert not (tmp_path / "named").exists()
    # an artifact without covariates given as --covariates: refused
    res = _eval(world, tmp_path / "none", "--covariates", d / "emb.zarr", "--methods", "history")
    assert res.exit_code != 0 and "holds no covariates" in res.output
