"""The embedding peers (ridge read-out, DOTS) against brute-force computations, and their refusals."""

from __future__ import annotations

import numpy as np
import pytest

from graphdiff_cli.evaluation import baselines as B
from graphdiff_cli.core import belief, readout
from graphdiff_cli.errors import DataError, InvalidArgumentError


def _log(rng, n_nodes, steps, batch):
    """Random steps (ids, n, s), prompts revisited, one prompt listed twice in the first step."""
    out = []
    for t in range(steps):
        ids = rng.choice(n_nodes, batch, replace=False)
        if t == 0:
            ids = np.r_[ids, ids[0]]
        n = rng.integers(1, 9, ids.size)
        out.append((ids, n, rng.binomial(n, 0.3)))
    return out


# -- ridge read-out -----------------------------------------------------------------------------------


def _ridge_from_scratch(e, successes, rollouts, ridge, fill):
    """The ridge fit solved from the rows themselves: numpy only, no sufficient statistics."""
    seen = rollouts > 0
    if not seen.any():
        return np.full(e.shape[0], fill)
    x = np.c_[np.ones(e.shape[0]), e]
    xs, y = x[seen], successes[seen] / rollouts[seen]
    pen = ridge * np.eye(x.shape[1])
    pen[0, 0] = 0.0  # intercept unpenalised
    theta = np.linalg.solve(xs.T @ xs + pen, xs.T @ y)
    return np.clip(x @ theta, 0.0, 1.0)


def test_ridge_incremental_statistics_equal_a_fit_from_scratch():
    rng = np.random.default_rng(0)
    e = rng.standard_normal((50, 6))
    est = B.RidgeReadout(e)
    S, C = np.zeros(50), np.zeros(50)
    for ids, n, s in _log(rng, 50, 7, 12):
        est.update(ids, n, s)
        np.add.at(S, ids, s)
        np.add.at(C, ids, n)
        seen = C > 0
        x = readout.features(e)
        gram, moment = readout.stats_of(x[seen], np.ones(seen.sum()), S[seen] / C[seen])
        np.testing.assert_allclose(est.gram_, gram, atol=1e-9)
        np.testing.assert_allclose(est.moment_, moment, atol=1e-9)
        g = S.sum() / C.sum()
        for lam in readout.RIDGE_GRID:
            np.testing.assert_allclose(est._readout(np.arange(50), float(lam)),
                                       _ridge_from_scratch(e, S, C, lam, g), atol=1e-8)


def test_ridge_online_choices_equal_a_brute_force_replay():
    rng = np.random.default_rng(1)
    e = rng.standard_normal((40, 5))
    steps = _log(rng, 40, 8, 10)
    est = B.RidgeReadout(e)
    S, C = np.zeros(40), np.zeros(40)
    err_r, err_k = np.zeros(3), np.zeros(12)
    for ids, n, s in steps:
        # brute force: the fits from scratch, strengths by the smallest summed absolute error so far
        g = S.sum() / C.sum() if C.sum() else 0.5
        # 10 before any error and while it ties the smallest (readout.choose_ridge's start)
        # ties: within TIE_RTOL of the smallest (relative), then the first
        def first_within(err):
            return int(np.flatnonzero(err <= err.min() + abs(err.min()) * belief.TIE_RTOL + 1e-12)[0])

        tied = err_r[1] <= err_r.min() + abs(err_r.min()) * belief.TIE_RTOL + 1e-12
        lam = 10.0 if tied else readout.RIDGE_GRID[first_within(err_r)]
        kappa = belief.KAPPA_GRID[first_within(err_k)]
        m_all = _ridge_from_scratch(e, S, C, lam, g)
        want = (kappa * m_all + S) / (kappa + C)
        assert (est.ridge, est.kappa) == (lam, kappa)
        np.testing.assert_allclose(est.predict(np.arange(40)), want, atol=1e-8)
        # the step's own rows, summed per prompt, scored before their outcomes are counted
        uniq = np.unique(ids)
        nn = np.array([n[ids == i].sum() for i in uniq])
        ss = np.array([s[ids == i].sum() for i in uniq])
        rate = ss / nn
        for j, lj in enumerate(readout.RIDGE_GRID):
            err_r[j] += np.abs(_ridge_from_scratch(e, S, C, lj, g)[uniq] - rate).sum()
        for j, kj in enumerate(belief.KAPPA_GRID):
            err_k[j] += np.abs((kj * m_all[uniq] + S[uniq]) / (kj + C[uniq]) - rate).sum()
        est.update(ids, n, s)
        S[uniq] += ss
        C[uniq] += nn
    np.testing.assert_allclose(est.ridge_errors_, err_r, atol=1e-8)
    np.testing.assert_allclose(est.kappa_errors_, err_k, atol=1e-8)


def test_ridge_before_any_outcome_and_for_unseen_prompts():
    e = np.eye(4)
    est = B.RidgeReadout(e)
    np.testing.assert_allclose(est.predict(np.arange(4)), 0.5)  # nothing fitted: the global rate, 0.5
    est.update(np.array([0]), np.array([8]), np.array([2]))
    p = est.predict(np.arange(4))
    # one prompt with evidence: the intercept-only direction fits 0.25 for the rest; prompt 0 mixes its own
    assert p[0] == pytest.approx((est.kappa * est._readout(np.array([0]), est.ridge)[0] + 2) / (est.kappa + 8))
    assert np.all((p >= 0) & (p <= 1))


# -- DOTS ------------------------------------------------------------------------------------------------


def _dots_loop(e, ref, values, queries, tau=1.0, top_k=None, calibrate=True):
    """DOTS by explicit loops: LayerNorm, scaled dot products, softmax, least-squares line on the reference."""
    d = e.shape[1]

    def ln(v):
        mu = sum(v) / d
        var = sum((x - mu) ** 2 for x in v) / d
        return [(x - mu) / (var + 1e-5) ** 0.5 for x in v]

    z = [ln(list(row)) for row in e]

    def attend(i):
        scores = [sum(a * b for a, b in zip(z[i], z[j])) / d ** 0.5 for j in ref]
        keep = list(range(len(ref)))
        if top_k is not None and top_k < len(ref):
            keep = sorted(keep, key=lambda j: -scores[j])[:top_k]
        top = max(scores[j] for j in keep)
        w = {j: np.exp((scores[j] - top) / tau) for j in keep}
        return sum(w[j] * values[j] for j in keep) / sum(w.values())

    raw = np.array([attend(i) for i in queries])
    if not calibrate:
        return raw
    x = np.array([attend(i) for i in ref])
    slope, intercept = np.polyfit(x, np.asarray(values), 1)
    return np.clip(slope * raw + intercept, 0, 1)


@pytest.mark.parametrize("top_k", [None, 3])
def test_dots_equals_a_loop_over_the_most_recent_reference_prompts(top_k):
    rng = np.random.default_rng(2)
    e = rng.standard_normal((30, 7))
    est = B.DOTS(e, ref_size=8, top_k=top_k)
    assert np.all(est.predict(np.arange(30)) == 0.5)  # before any outcome
    last = {}
    for t, (ids, n, s) in enumerate(_log(rng, 30, 4, 5)):
        est.update(ids, n, s)
        uniq = np.unique(ids)
        for i in uniq:
            last[int(i)] = (t, n[ids == i].sum(), s[ids == i].sum())
    # the reference: the 8 most recently observed prompts (this step's 5, then 3 of the previous step's in id
    # order), each labelled with its latest visit's rate
    ranked = sorted(last, key=lambda i: (-last[i][0], i))[:8]
    ref = sorted(ranked)
    assert est.ref_ids_.tolist() == ref
    values = [last[i][2] / last[i][1] for i in ref]
    np.testing.assert_allclose(est.predict(np.arange(30)), _dots_loop(e, ref, values, range(30), top_k=top_k),
                               atol=1e-10)
    # the uncalibrated head at another temperature, on one step
    plain = B.DOTS(e, ref_size=8, top_k=top_k, calibrate=False, tau=0.5)
    plain.update(np.array([1, 4, 9]), np.array([8, 8, 8]), np.array([1, 5, 8]))
    np.testing.assert_allclose(plain.predict(np.arange(30)),
                               _dots_loop(e, [1, 4, 9], [1 / 8, 5 / 8, 1.0], range(30), tau=0.5, top_k=top_k,
                                          calibrate=False), atol=1e-10)


def test_dots_blocks_give_the_unblocked_answer(monkeypatch):
    rng = np.random.default_rng(4)
    e = rng.standard_normal((60, 5))
    est = B.DOTS(e, ref_size=20, top_k=6)
    est.update(np.arange(25), np.full(25, 8), rng.integers(0, 9, 25))
    whole = est.predict(np.arange(60))
    monkeypatch.setattr(B, "_DOTS_BLOCK", 7)
    np.testing.assert_allclose(est.predict(np.arange(60)), whole, atol=1e-12)


def test_dots_constant_reference_calibrates_to_its_mean():
    est = B.DOTS(np.eye(3)[:, :3] + 0.1, ref_size=1)
    est.update(np.array([2]), np.array([4]), np.array([1]))
    np.testing.assert_allclose(est.predict(np.arange(3)), 0.25)


# -- refusals --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [B.RidgeReadout, B.DOTS, B.VIP])
def test_embedding_peers_refuse_bad_embeddings(cls):
    with pytest.raises(DataError, match="2-D array of prompt embeddings"):
        cls(np.zeros(4))
    with pytest.raises(DataError, match="NaN or infinite"):
        cls(np.array([[np.nan, 1.0]]))


def test_dots_refuses_bad_settings():
    e = np.eye(3)
    for kw, msg in (({"ref_size": 0}, "reference size"), ({"tau": 0.0}, "temperature"), ({"top_k": 0}, "top_k")):
        with pytest.raises(InvalidArgumentError, match=msg):
            B.DOTS(e, **kw)


def test_registry_skips_or_refuses_embedding_peers_without_embeddings():
    import scipy.sparse as sp

    from graphdiff_cli.evaluation.methods import EMBEDDING_METHODS, build_methods, load_config, method_factories

    assert EMBEDDING_METHODS == ("vip", "dots", "ridge")
    cfg = load_config(None)
    w = sp.csr_matrix((4, 4))
    labels = np.zeros(4, dtype=np.int64)
    got = method_factories(["history", "ridge", "dots", "vip"], cfg, w, labels, 1, None, 4)
    assert list(got) == ["history"]
    for key in EMBEDDING_METHODS:
        with pytest.raises(InvalidArgumentError, match=f"method {key} needs prompt embeddings"):
            build_methods([key], cfg, w, labels, 1, None, 4)
    e = np.eye(4)
    methods, described = build_methods(list(EMBEDDING_METHODS), cfg, w, labels, 1, e, 4)
    assert [m.name for m in methods] == ["vip", "dots", "ridge"]
    assert described["dots"]["ref_size"] == 256 and described["vip"]["recursive"] is True


@pytest.mark.slow  # embeds 64 real prompts with the bundled encoder: ~20 s on 2 cores
@pytest.mark.shared_data
def test_evaluate_with_the_embedding_peers_on_real_one_shot_prompts(shared_data, tmp_path):
    """A real artifact: 64 One-Shot-RLVR prompts embedded, graphed and clustered by graphdiff, their first
    five recorded visits as five steps; the report's ridge, DOTS and VIP figures are a direct replay's."""
    import json

    from typer.testing import CliRunner

    from graphdiff_cli.cli.app import app
    from graphdiff_cli.evaluation.replay import replay
    from graphdiff_cli.io.readers import embedding_matrix, read_graph

    def gd(*args):
        res = CliRunner().invoke(app, [str(a) for a in args])
        assert res.exit_code == 0, res.output
        return res

    src = shared_data / "oneshot_rlvr"
    keep = {}
    with open(src / "prompts.jsonl", encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            keep[row["index"]] = {"id": str(row["index"]), "prompt": row["problem"]}
            if len(keep) == 64:
                break
    log = []
    with open(src / "acc_history.jsonl", encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            if r["index"] in keep and r["visit"] < 5:
                log.append({"step": r["visit"] + 1, "id": str(r["index"]), "n": r["n_rollouts"], "s": r["n_correct"]})
    log.sort(key=lambda r: (r["step"], int(r["id"])))
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in keep.values()))
    (tmp_path / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in log))
    emb, graph, cl, out = (tmp_path / x for x in ("e.zarr", "g.zarr", "c.zarr", "report"))
    gd("embed", tmp_path / "p.jsonl", "--out", emb)
    gd("build-graph", emb, "--out", graph, "--k-nn", 8)
    gd("cluster", graph, "--out", cl, "--states", 4)
    res = gd("evaluate", "--log", tmp_path / "log.jsonl", "--graph", graph, "--clusters", cl, "--embeddings", emb,
             "--out", out, "--methods", "history,vip,dots,ridge", "--device", "cpu", "--json")
    assert json.loads(res.stdout)["methods"] == ["history", "vip", "dots", "ridge"]
    doc = json.loads((out / "metrics.json").read_text())
    g = read_graph(graph)
    e = embedding_matrix(emb, g)
    ids = g.index.nodes([r["id"] for r in log])
    step, n, s = (np.array([r[k] for r in log]) for k in ("step", "n", "s"))
    ref = replay(step, ids, n, s, [B.VIP(e), B.DOTS(e), B.RidgeReadout(e)])
    for name in ("vip", "dots", "ridge"):
        got = doc["metrics"]["methods"][name]["phases"]["full"]["all"]["mae"]
        assert got == pytest.approx(float(np.mean(np.abs(ref.predictions[name] - ref.rate))), rel=1e-9)
        assert 0.0 < got < 0.5
