"""Live features from the trainer (``estimator.sources.live``): the read-out of per-prompt numbers observed at a
step, fitted online with its statistics forgotten per step; it abstains for a prompt read without them, so such a
read predicts exactly as without it; its statistics are saved; bad live inputs are refused in one line."""

import numpy as np
import pytest

from graphdiff_cli import Estimator
from graphdiff_cli.core import readout as ro
from graphdiff_cli.errors import DataError
from graphdiff_cli.estimator.sources import Context
from graphdiff_cli.estimator.versions import MIGRATIONS

from _tolerances import FLOAT64
from test_estimator_options import problem

KW = dict(device="cpu", dtype="float64")


def live_steps(rng, true_p, count, size=30, noise=0.3):
    """Steps whose live features say something of each prompt's success: (entropy-like, max-prob-like)."""
    for _ in range(count):
        ids = rng.choice(true_p.size, size, replace=False)
        p = true_p[ids]
        live = np.stack([2.0 * (1.0 - p) + rng.normal(0, noise, size), p + rng.normal(0, noise, size)], axis=1)
        yield ids, np.full(size, 8), rng.binomial(8, p), live


def brute_live_theta(history, rho, ridge):
    """The ridge fit on [1, live] of every (prompt, step) pair so far, step t weighted rho^(T - 1 - t), solved
    densely (the intercept unpenalised)."""
    xs, ys, ws = [], [], []
    t_last = len(history) - 1
    for t, (live, rate) in enumerate(history):
        xs.append(np.concatenate([np.ones((live.shape[0], 1)), live], axis=1))
        ys.append(rate)
        ws.append(np.full(live.shape[0], rho ** (t_last - t)))
    x, y, w = np.concatenate(xs), np.concatenate(ys), np.concatenate(ws)
    a = (x * w[:, None]).T @ x + ridge * np.diag([0.0] + [1.0] * (x.shape[1] - 1))
    return np.linalg.solve(a, (x * w[:, None]).T @ y)


def test_the_live_fit_is_the_dense_ridge_solve_with_forgetting():
    w, labels, true_p, rng = problem()
    est = Estimator(w, labels, 8, live_readout=1.0, live_forgetting=0.8, readout_ridge=10.0, **KW)
    history = []
    for t, (ids, n, s, live) in enumerate(live_steps(rng, true_p, 6)):
        if t == 3:  # a step without live features: the statistics are forgotten all the same
            est.update(ids, n, s)
            history.append((np.zeros((0, 2)), np.zeros(0)))
            continue
        live[:4] = np.nan  # these prompts had no features at this step: no pair
        est.update(ids, n, s, live=live)
        history.append((live[4:], s[4:] / n[4:]))
    theta = brute_live_theta(history, 0.8, 10.0)
    src = est.mix.source("live_readout")
    np.testing.assert_allclose(ro.solve(src.live_gram_, src.live_moment_, 10.0), theta, **FLOAT64)
    # weight 1: the graph's estimate of a prompt with live features is the read-out of them
    ids = np.arange(20)
    live = rng.normal(0.5, 0.5, (20, 2))
    live[:3] = np.nan
    graph = est._graph_estimate(ids, *est._model_prediction(ids), Context(live=live))
    want = np.clip(theta[0] + live[3:] @ theta[1:], 0, 1)
    np.testing.assert_allclose(graph[3:], want, **FLOAT64)
    plain = est._graph_estimate(ids, *est._model_prediction(ids))
    np.testing.assert_allclose(graph[:3], plain[:3], **FLOAT64)  # abstained: m_{j-1}, the same numbers
    assert est.live_features_ == 2


def test_abstention_leaves_predictions_exactly_as_without_live_features():
    w, labels, true_p, rng = problem()
    est = Estimator(w, labels, 8, **KW)  # the default preset: live_readout auto
    off = Estimator(w, labels, 8, live_readout=None, **KW)
    for ids, n, s, _ in live_steps(rng, true_p, 5):
        est.update(ids, n, s)
        off.update(ids, n, s)
    np.testing.assert_allclose(est.predict(), off.predict(), **FLOAT64)  # never given: as if it were off
    for ids, n, s, live in live_steps(rng, true_p, 5):
        est.update(ids, n, s, live=live)
    assert est.live_readout_ is not None and est.mix_errors_.shape[4] == ro.READOUT_GRID.size
    ids = np.arange(40)
    live = rng.normal(0.5, 0.5, (40, 2))
    live[::3] = np.nan
    plain = est.estimates(ids)
    with_nan = est.estimates(ids, live=np.full((40, 2), np.nan))
    partial = est.estimates(ids, live=live)
    for key in plain:
        np.testing.assert_allclose(with_nan[key], plain[key], **FLOAT64)  # no row given: the same computation
        np.testing.assert_allclose(partial[key][::3], plain[key][::3], **FLOAT64)  # the rows without features
    assert not np.array_equal(partial["p"], plain["p"])  # the others moved
    shares = est.source_weights(ids, live=live)
    assert (shares["live_readout"][::3] == 0).all() and (shares["live_readout"][1::3] > 0).all()
    np.testing.assert_allclose(sum(v for v in shares.values() if v is not None), 1.0, **FLOAT64)
    np.testing.assert_array_equal(est.source_weights(ids)["live_readout"], np.zeros(40))


def test_the_live_weight_and_ridge_are_scored_on_the_steps_with_live_features():
    w, labels, true_p, rng = problem()
    est = Estimator(w, labels, 8, **KW)
    ridge_err = np.zeros(ro.RIDGE_GRID.size)
    for ids, n, s, live in live_steps(rng, true_p, 8, noise=0.05):
        src = est.mix.source("live_readout")
        if src.n_features is not None:
            obs_order = np.argsort(ids)  # the step's prompts as the estimator aggregates them (sorted ids)
            fits = src.fits(Context(live=live[obs_order]), ro.RIDGE_GRID)
            ridge_err += [np.abs(f - (s / n)[obs_order]).sum() for f in fits]
        est.update(ids, n, s, live=live)
    np.testing.assert_allclose(est.mix.board["live_errors"], ridge_err, **FLOAT64)
    assert est.live_readout_ > 0  # informative features: the live read-out is weighed in


def test_a_state_with_live_statistics_round_trips_save_and_load(tmp_path):
    w, labels, true_p, rng = problem()
    est = Estimator(w, labels, 8, **KW)
    for ids, n, s, live in live_steps(rng, true_p, 4):
        est.update(ids, n, s, live=live)
    est.save(tmp_path / "est")
    back = Estimator.load(tmp_path / "est")
    src, got = est.mix.source("live_readout"), back.mix.source("live_readout")
    np.testing.assert_array_equal(got.live_gram_, src.live_gram_)
    np.testing.assert_array_equal(got.live_moment_, src.live_moment_)
    np.testing.assert_array_equal(back.mix.board["live_errors"], est.mix.board["live_errors"])
    live = rng.normal(0.5, 0.5, (est.n_nodes, 2))
    np.testing.assert_allclose(back.predict(live=live), est.predict(live=live), **FLOAT64)
    ids, n, s, live = next(live_steps(rng, true_p, 1))
    est.update(ids, n, s, live=live)
    back.update(ids, n, s, live=live)
    np.testing.assert_allclose(back.predict(ids, live=live), est.predict(ids, live=live), **FLOAT64)
    with pytest.raises(DataError, match="live features have 3 columns"):
        back.update(ids, n, s, live=np.ones((ids.size, 3)))  # f stays as the saved statistics say


def test_a_version_8_state_gets_the_live_arrays_empty_and_a_live_axis():
    w, labels, true_p, rng = problem()
    est = Estimator(w, labels, 8, **KW)
    for ids, n, s, _ in live_steps(rng, true_p, 3):
        est.update(ids, n, s)
    sd = est.state_dict()
    v8 = {k: v for k, v in sd.items() if k not in ("covariate_gram", "covariate_moment", "covariate_errors",
                                                   "live_gram", "live_moment", "live_errors", "covariates",
                                                   "reference_rate")}
    v8["mix_errors"] = sd["mix_errors"][:, :, :, 0, 0, :]
    v8["config"] = {k: v for k, v in sd["config"].items() if k not in ("covariate_readout", "live_readout",
                                                                       "live_forgetting")}
    v8["version"] = 8
    up = MIGRATIONS[8](v8)
    assert up["live_gram"].shape == (0, 0) and up["live_moment"].shape == (0,) and up["live_errors"].shape == (0,)
    assert up["mix_errors"].shape == sd["mix_errors"].shape[:4] + (1,) + sd["mix_errors"].shape[5:]
    back = Estimator.from_state_dict(v8)
    assert back.live_readout_ is None
    np.testing.assert_allclose(back.predict(), est.predict(), **FLOAT64)


@pytest.mark.parametrize("live, match", [
    (np.ones((29, 2)), "numeric 30 x f array"),
    (np.ones((30, 2, 1)), "numeric 30 x f array"),
    (np.array([["a", "b"]] * 30), "numeric 30 x f array"),
    (np.where(np.eye(30, 2) > 0, np.inf, 0.0), "row 0 holds an infinite value"),
    (np.where(np.eye(30, 2) > 0, np.nan, 0.0), "row 0 holds an infinite value or a NaN among numbers"),
])
def test_bad_live_inputs_are_refused_in_one_line(live, match):
    w, labels, true_p, rng = problem()
    est = Estimator(w, labels, 8, **KW)
    ids, n, s, _ = next(live_steps(rng, true_p, 1))
    before = est.state_dict()
    with pytest.raises(DataError, match=match) as err:
        est.update(ids, n, s, live=live)
    assert "\n" not in str(err.value) and est.step_ == 0
    np.testing.assert_array_equal(est.state_dict()["successes"], before["successes"])
    with pytest.raises(DataError, match=match):
        est.predict(ids, live=live)


def test_the_number_of_live_features_is_fixed_by_the_first_step_that_gives_them():
    w, labels, true_p, rng = problem()
    est = Estimator(w, labels, 8, **KW)
    (ids, n, s, live), (ids2, n2, s2, _) = live_steps(rng, true_p, 2)
    est.update(ids, n, s, live=live)
    with pytest.raises(DataError, match="have 1 columns; this estimator's live read-out was first given 2") as err:
        est.update(ids2, n2, s2, live=live[:, :1])
    assert "\n" not in str(err.value) and est.step_ == 1
    with pytest.raises(DataError, match="first given 2"):
        est.predict(ids2, live=np.ones((30, 3)))


# ------------------------------------------------------------------------------ the STATE and the CLI


@pytest.fixture
def state(tmp_path):
    from graphdiff_cli import State

    from _handoff_fixtures import make_inputs

    graph, clusters, ids = make_inputs(tmp_path)
    st = State.init(graph, clusters, tmp_path / "STATE", device="cpu", durable=False)
    return st, ids


def test_a_step_s_rows_carry_live_features_and_a_read_takes_them(state, tmp_path):
    import json
    import subprocess

    from _handoff_fixtures import GRAPHDIFF

    st, ids = state
    rng = np.random.default_rng(0)
    for t in range(1, 4):
        batch = ids[(t - 1) * 12:t * 12]
        rows = [{"id": pid, "n": 8, "s": int(rng.integers(0, 9))} for pid in batch]
        live = np.array([[r["s"] / 8 + rng.normal(0, 0.05), 1 - r["s"] / 8] for r in rows])
        live[0] = np.nan  # no features for the first row
        st.update(t, rows, live=live)
    est = st.estimator()
    assert est.live_features_ == 2 and est.mix.source("live_readout").live_gram_[0, 0] > 0
    logged = [json.loads(line) for line in open(st.dir.log_entry((3, 0))["outcomes"])]
    assert "live" not in logged[0] and len(logged[1]["live"]) == 2  # the record of the step holds them
    # a file of live features for a read: the same as the arrays, and a candidate without a row abstains
    cand = ids[36:48]
    feats = rng.normal(0.5, 0.3, (12, 2))
    path = tmp_path / "live.jsonl"
    path.write_text("".join(json.dumps({"id": pid, "live": f.tolist()}) + "\n" for pid, f in zip(cand[:6], feats)))
    by_file = st.estimates(cand, live=path)
    feats[6:] = np.nan
    by_array = st.estimates(cand, live=feats)
    plain = st.estimates(cand)
    np.testing.assert_allclose(by_file["p"], by_array["p"], **FLOAT64)
    np.testing.assert_allclose(by_file["p"][6:], plain["p"][6:], **FLOAT64)
    assert not np.array_equal(by_file["p"][:6], plain["p"][:6])
    sel = st.select(cand, 4, "target", live=path)
    cli = subprocess.run([str(GRAPHDIFF), "select", "--state", str(st.path), "--candidates",
                          str(_ids_file(tmp_path, cand)), "-B", "4", "--strategy", "target", "-o",
                          str(tmp_path / "sel.txt"), "--live-features", str(path)], capture_output=True, text=True)
    assert cli.returncode == 0, cli.stderr
    assert (tmp_path / "sel.txt").read_text().split() == sel["ids"]
    res = st.predict(tmp_path / "pred.jsonl", ids_file=_ids_file(tmp_path, cand), live=path)
    got = [json.loads(line)["p"] for line in open(res["out"])]
    np.testing.assert_allclose(got, by_file["p"], **FLOAT64)  # written as JSON (exact float64), computed again
    alloc = st.allocate(cand, 48, "variance", live=path)
    assert sum(alloc["counts_by_id"].values()) == 48


def test_a_step_s_live_features_a_state_does_not_read_are_said_in_a_warning(tmp_path):
    from graphdiff_cli import State

    from _handoff_fixtures import make_inputs

    graph, clusters, ids = make_inputs(tmp_path)
    st = State.init(graph, clusters, tmp_path / "STATE", device="cpu", durable=False, preset="paper")
    rows = [{"id": pid, "n": 8, "s": 3} for pid in ids[:6]]
    res = st.update(1, rows, live=np.full((6, 2), 0.5))
    assert any("live features are not used" in w for w in res["warnings"])
    res = st.update(2, rows)
    assert not any("live features" in w for w in res["warnings"])


def _ids_file(tmp_path, ids):
    path = tmp_path / "cand.txt"
    path.write_text("\n".join(ids) + "\n")
    return path


def test_bad_live_features_of_a_read_or_a_step_are_refused_in_one_line(state, tmp_path):
    import json
    import subprocess

    from graphdiff_cli.errors import GraphdiffError

    from _handoff_fixtures import GRAPHDIFF

    st, ids = state
    stray = tmp_path / "stray.jsonl"
    stray.write_text(json.dumps({"id": ids[40], "live": [0.1, 0.2]}) + "\n")
    cli = subprocess.run([str(GRAPHDIFF), "predict", "--state", str(st.path), "--ids", str(_ids_file(tmp_path, ids[:5])),
                          "-o", str(tmp_path / "p.jsonl"), "--live-features", str(stray)], capture_output=True,
                         text=True)
    assert cli.returncode != 0 and "not among the 5 candidates" in cli.stderr
    assert len([line for line in cli.stderr.splitlines() if line.strip()]) == 1
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"id": ids[0], "live": [0.1, "x"]}) + "\n")
    with pytest.raises(GraphdiffError, match="live holds 'x'"):
        st.estimates(ids[:5], live=bad)
    rows = [{"id": ids[0], "n": 4, "s": 1, "live": [0.1, 0.2]}, {"id": ids[1], "n": 4, "s": 2, "live": [0.3]}]
    with pytest.raises(GraphdiffError, match="outcome row 2: 1 live features, 2 for line 1") as err:
        st.update(1, rows)
    assert "\n" not in str(err.value) and st.step == 0
    with pytest.raises(GraphdiffError, match="one row per outcome row"):
        st.update(1, rows[:1], live=np.ones((2, 2)))
    st.update(1, rows[:1])
    with pytest.raises(GraphdiffError, match="first given 2"):
        st.estimates(ids[:3], live=np.ones((3, 1)))


# ------------------------------------------------------------------------------ the TRL hook


def test_the_trl_hook_computes_the_next_token_entropy_and_max_probability_of_the_policy():
    pytest.importorskip("trl", reason="trl is not installed (pip install 'graphdiff-rl[trl]')")
    import torch

    from graphdiff_cli.integrations.trl import next_token_features

    from _tolerances import FLOAT32_NETWORK
    from test_trl_integration import _tiny_lm, _tokenizer

    tok = _tokenizer()
    model = _tiny_lm(tok)
    model.train()  # the hook reads the policy in eval mode and gives its mode back
    prompts = ["Problem p001 add the numbers", "Problem p002 add", "the numbers 3 plus 4 is so answer p031"]
    got = next_token_features(model, tok, prompts)
    assert model.training and got.shape == (3, 2) and tok.padding_side == "right"
    model.eval()
    for text, (entropy, top) in zip(prompts, got):
        ids = tok(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            p = torch.softmax(model(input_ids=ids).logits[0, -1].double(), dim=-1).numpy()
        np.testing.assert_allclose(entropy, -(p * np.log(p)).sum(), **FLOAT32_NETWORK)  # alone, unpadded
        np.testing.assert_allclose(top, p.max(), **FLOAT32_NETWORK)
    assert got[:, 0].max() > got[:, 0].min()  # the prompts differ


@pytest.mark.slow
def test_live_features_in_a_grpo_run_reach_the_update_and_the_log(tmp_path):
    pytest.importorskip("trl", reason="trl is not installed (pip install 'graphdiff-rl[trl]')")
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from graphdiff_cli import State
    from graphdiff_cli.integrations.trl import GraphdiffTRL

    from _handoff_fixtures import make_inputs
    from test_trl_integration import N_GEN, N_PROMPTS, _rule, _tiny_lm, _tokenizer

    graph, clusters, ids = make_inputs(tmp_path, n=N_PROMPTS, k_states=4, prefix="p")
    state = tmp_path / "STATE"
    State.init(graph, clusters, state, device="cpu", durable=False)
    ds = Dataset.from_list([{"prompt": f"Problem {pid} add the numbers", "id": pid} for pid in ids])

    def correctness(prompts, completions, id, **kwargs):
        return [_rule(c, 0.5) for c in completions]

    gd = GraphdiffTRL(state, strategy="target", pool_factor=2.0, seed=3, durable=False, live_features=True)
    tok = _tokenizer()
    args = GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4 * N_GEN, num_generations=N_GEN,
                      max_completion_length=4, max_steps=2, learning_rate=1e-3, beta=0.0, logging_steps=1,
                      report_to=[], save_strategy="no", use_cpu=True, seed=0, dataloader_num_workers=0,
                      disable_tqdm=True)
    trainer = GRPOTrainer(model=_tiny_lm(tok), processing_class=tok, args=args, train_dataset=ds,
                          reward_funcs=[gd.reward(correctness)])
    gd.attach(trainer)
    trainer.train()
    assert [e["step"] for e in gd.applied] == [1, 2]
    for entry in gd.applied:
        assert entry["live"].shape == (len(entry["ids"]), 2) and np.isfinite(entry["live"]).all()
        assert entry["metrics"]["graphdiff/live_seconds"] > 0 and 0 < entry["metrics"]["graphdiff/live_share"] <= 1
    est = State.open(state).estimator()
    assert est.live_features_ == 2 and est.mix.source("live_readout").live_gram_[0, 0] > 0
    logged = [m for m in trainer.state.log_history if "graphdiff/live_seconds" in m]
    assert logged  # the cost reached the trainer's log
