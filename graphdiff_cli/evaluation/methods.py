"""The method registry: every estimator that ``evaluate``, the counterfactual replay and the benchmarks
compare, built by key from one config.

- ``METHOD_KEYS``: graphdiff, the peers (history, discounted history, MoPPS, GRESO, the embedding peers
  VIP, DOTS and the ridge read-out, label propagation) and the two oracles, in report order;
  ``parse_methods`` reads ``--methods``. ``EMBEDDING_METHODS`` need prompt embeddings: without them
  ``build_methods`` refuses them and ``method_factories`` leaves them out.
- ``load_config``: the ``estimator`` section (graphdiff's settings, read by ``settings.config_layer`` as
  init reads it) and the peers' settings (``DEFAULT_CONFIG``; the workflow's ``evaluate.settings``) of a
  YAML/JSON file shaped like the Snakemake config.
- ``build_methods``: fresh estimators for the keys; ``method_factories``: zero-argument factories of
  fresh ones (a counterfactual replay needs one per strategy).
- ``GraphdiffMethod``: graphdiff's ``Estimator`` behind ``evaluation.baselines``' interface (``OnlineEstimator``
  with ``BeliefEstimator.moments``), so core never imports the facade.
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np

from ..errors import InvalidArgumentError

# method keys accepted by --methods, in report order; oracles last
METHOD_KEYS = ("graphdiff", "history", "discounted", "mopps", "greso", "vip", "dots", "ridge", "labelprop", "sbr",
               "sbs")
ORACLE_KEYS = ("sbr", "sbs")
# the methods that read the prompt embeddings (evaluate's --embeddings): skipped without them unless named
EMBEDDING_METHODS = ("vip", "dots", "ridge")
# the methods that can drive decisions in a counterfactual replay (no oracles)
COUNTERFACTUAL_METHODS = ("graphdiff", "history", "discounted", "mopps", "greso", "vip", "dots", "ridge", "labelprop")
# discounted history where it is not tuned on the log (hindsight): the peers' suggested start
DISCOUNTED = {"lam": 0.9, "m": 1.0}

DEFAULT_CONFIG = {
    "evaluate": {
        # discounted history: grid searched on the log itself (hindsight tuning: optimistic for it)
        "discounted": {"lambdas": [1.0, 0.95, 0.9, 0.8, 0.7, 0.5], "m": [0.0, 0.5, 1.0, 2.0, 4.0]},
        "mopps": {"lambdas": [1.0, 0.5]},
        "greso": {"tau": 0.25},
        # VIP as the authors' trainer runs it (posterior mean carried from step to step), the prior mean of
        # their benchmark and the peers note (their trainer: -5); recursive: false = the previous step only
        "vip": {"length_scale": 0.4, "noise": 1e-4, "prior_mean": -1.0, "recursive": True},
        # DOTS's inference settings: reference set of 256 (the most recent observed prompts here), softmax
        # temperature 1, every reference prompt attended (top_k null), the least-squares calibration line
        "dots": {"ref_size": 256, "tau": 1.0, "top_k": None, "calibrate": True},
        # the ridge read-out: both its strengths (ridge, evidence mixing) are chosen online; nothing to set
        "ridge": {},
        "oracles": {"probe": "resample", "seed": 0},
    },
}


class GraphdiffMethod:
    """graphdiff's ``Estimator`` behind the peers' interface (``evaluation.baselines``).

    ``moments`` is the belief `graphdiff select` decides by (``Estimator.estimates``' mean, variance and
    p_zero_variance); ``zero_variance`` its E[p^g + (1 - p)^g].
    """

    def __init__(self, estimator, name: str = "graphdiff"):
        self.estimator = estimator
        self.name = name
        self.last_update_: dict | None = None

    def predict(self, ids) -> np.ndarray:
        return np.asarray(self.estimator.predict(np.asarray(ids, dtype=np.int64)), dtype=np.float64)

    def moments(self, ids, group_size: int) -> dict[str, np.ndarray]:
        est = self.estimator.estimates(np.asarray(ids, dtype=np.int64), group_size=int(group_size))
        return {"p": np.asarray(est["mean"], dtype=np.float64), "variance": np.asarray(est["variance"], dtype=np.float64),
                "p_zero_variance": np.asarray(est["p_zero_variance"], dtype=np.float64)}

    def zero_variance(self, ids, group_size: int) -> np.ndarray:
        est = self.estimator.estimates(np.asarray(ids, dtype=np.int64), group_size=int(group_size))
        return np.asarray(est["p_zero_variance"], dtype=np.float64)

    def update(self, ids, n, s) -> None:
        self.last_update_ = self.estimator.update(np.asarray(ids, dtype=np.int64), np.asarray(n, dtype=np.int64),
                                                  np.asarray(s, dtype=np.int64))


# the workflow's own keys of its `evaluate:` section (workflow/schemas/config.schema.yaml); the baselines'
# settings sit under its `settings`
WORKFLOW_EVALUATE_KEYS = ("enabled", "methods", "counterfactual", "settings")


def load_config(path) -> dict:
    """{"estimator": EstimatorSettings, "estimator_preset": name, "evaluate": the peers' settings}.

    The file has the Snakemake config's shape (so that file itself works): its ``estimator`` section is
    read as `graphdiff init --config` reads it (``settings.config_layer``: a preset and the settings that
    override it; a file of only those keys works too), and the peers' settings are the workflow's
    ``evaluate.settings``, or, in evaluate's older own shape, the ``evaluate`` section itself (its keys
    discounted, mopps, greso, vip, dots, ridge, oracles cannot be mistaken for the workflow's). They update
    ``DEFAULT_CONFIG``. Other top-level sections are ignored (one config file serves several commands);
    an unknown key inside these sections is refused in one line naming the file, so a typo cannot
    silently fall back to a default.
    """
    from ..settings import DEFAULT_PRESET, config_layer, resolve_layers

    cfg = copy.deepcopy(DEFAULT_CONFIG)
    user, lines, where = {}, {}, "the default config"
    if path is not None:
        from ..io.readers import read_mapping

        where = str(path)
        user, lines = read_mapping(Path(path))  # YAML or JSON (a YAML document)
    ev_user = user.get("evaluate") or {}
    if not isinstance(ev_user, dict):
        raise InvalidArgumentError(f"{where}: section 'evaluate' must be a mapping")
    if any(key in WORKFLOW_EVALUATE_KEYS for key in ev_user):
        for key in ev_user:
            if key not in WORKFLOW_EVALUATE_KEYS:
                raise InvalidArgumentError(f"{where}: unknown key evaluate.{key}; the baselines' settings go under "
                                           f"evaluate.settings (known there: {', '.join(cfg['evaluate'])})")
        ev_user = ev_user.get("settings") or {}
        if not isinstance(ev_user, dict):
            raise InvalidArgumentError(f"{where}: evaluate.settings must be a mapping")
    for key, value in ev_user.items():
        if key not in cfg["evaluate"]:
            raise InvalidArgumentError(f"{where}: unknown key evaluate.{key}; known: {', '.join(cfg['evaluate'])}")
        if not isinstance(value, dict):
            raise InvalidArgumentError(f"{where}: evaluate.{key} must be a mapping")
        for sub in value:
            if sub not in cfg["evaluate"][key]:
                raise InvalidArgumentError(f"{where}: unknown key evaluate.{key}.{sub}; known: "
                                           f"{', '.join(cfg['evaluate'][key])}")
        cfg["evaluate"][key].update(value)
    values, where_of = config_layer(user, lines, where, sections=("evaluate",))
    cfg["estimator"] = resolve_layers([(values, where_of)])
    cfg["estimator_preset"] = values.get("preset") or DEFAULT_PRESET
    return cfg


def with_device(cfg: dict, device: str | None) -> dict:
    """``cfg`` with graphdiff's inference device replaced (None: unchanged)."""
    if device is not None:
        from ..settings import from_dict

        cfg = {**cfg, "estimator": from_dict({**cfg["estimator"].as_dict(), "device": device}, "--device")}
    return cfg


def parse_methods(methods) -> list[str]:
    """Method keys from --methods (repeatable, comma-separated); None or "all" -> every method."""
    if not methods:
        return list(METHOD_KEYS)
    keys = []
    for item in methods:
        for key in str(item).split(","):
            key = key.strip().lower()
            if not key:
                continue
            if key == "all":
                return list(METHOD_KEYS)
            if key not in METHOD_KEYS:
                raise InvalidArgumentError(f"unknown method {key!r}; choose from {', '.join(METHOD_KEYS)}")
            if key not in keys:
                keys.append(key)
    if not keys:
        raise InvalidArgumentError("--methods names no method")
    return [k for k in METHOD_KEYS if k in keys]


def tune_discounted(log: dict, n_nodes: int, lambdas, ms) -> tuple[dict, list[dict]]:
    """Replay the (lambda, m) grid of discounted history; best = lowest full-log MAE.

    Returns (best {"lam", "m", "mae"}, grid rows {"lam", "m", "mae", "within_r"}).
    """
    from .baselines import DiscountedHistory
    from .metrics import mae, within_batch
    from .replay import replay

    lambdas = [float(x) for x in lambdas]
    ms = [float(x) for x in ms]
    if not lambdas or not ms:
        raise InvalidArgumentError("the discounted-history grid needs at least one lambda and one m")
    grid = [DiscountedHistory(n_nodes, lam, m, name=f"lam={lam:g},m={m:g}") for lam in lambdas for m in ms]
    res = replay(log["step"], log["id"], log["n"], log["s"], grid, n_nodes=n_nodes)
    rows = []
    for est in grid:
        p = res.predictions[est.name]
        rows.append({"lam": est.lam, "m": est.m, "mae": mae(p, res.rate),
                     "within_r": within_batch(res.step, p, res.rate)["pearson"]})
    best = min(rows, key=lambda r: (r["mae"], -r["lam"], r["m"]))
    return {"lam": best["lam"], "m": best["m"], "mae": best["mae"]}, rows


def _flag(value, where: str) -> bool:
    """A boolean setting, refused in one line when it is not one (YAML's "false" as text would be true)."""
    if not isinstance(value, (bool, np.bool_)):
        raise InvalidArgumentError(f"{where} must be true or false, got {value!r}")
    return bool(value)


def build_methods(keys, cfg, w, labels, k, embeddings, n_nodes, tuned=None) -> tuple[list, dict]:
    """Instantiate the requested methods; returns (estimators, {name: description of its settings})."""
    from . import baselines as B
    from ..estimator import Estimator

    ev, settings = cfg["evaluate"], cfg["estimator"]
    methods, described = [], {}

    def add(m, desc):
        methods.append(m)
        described[m.name] = desc

    for key in keys:
        if key in EMBEDDING_METHODS and embeddings is None:
            raise InvalidArgumentError(f"method {key} needs prompt embeddings: pass --embeddings EMBED.zarr")
        if key == "graphdiff":
            add(GraphdiffMethod(Estimator(w, labels, k, embeddings=embeddings, settings=settings)),
                {"method": "graphdiff", "preset": cfg.get("estimator_preset", "default"), "n_states": k,
                 **settings.as_dict()})
        elif key == "history":
            add(B.HistoryMean(n_nodes), {"method": "per-prompt history mean"})
        elif key == "discounted":
            lam, m = tuned["lam"], tuned["m"]
            add(B.DiscountedHistory(n_nodes, lam, m, name="discounted"),
                {"method": "discounted history", "lam": lam, "m": m, "tuned_on_this_log": tuned is not DISCOUNTED})
        elif key == "mopps":
            for lam in ev["mopps"]["lambdas"]:
                add(B.MoPPS(n_nodes, float(lam)), {"method": "MoPPS", "lam": float(lam)})
        elif key == "greso":
            add(B.GRESO(n_nodes, tau=float(ev["greso"]["tau"])), {"method": "GRESO", "tau": ev["greso"]["tau"]})
        elif key == "vip":
            v = ev["vip"]
            add(B.VIP(embeddings, length_scale=float(v["length_scale"]), noise=float(v["noise"]),
                      prior_mean=float(v["prior_mean"]), recursive=_flag(v["recursive"], "evaluate.vip.recursive")),
                {"method": "VIP Gaussian process", **v})
        elif key == "dots":
            v = ev["dots"]
            add(B.DOTS(embeddings, ref_size=v["ref_size"], tau=float(v["tau"]), top_k=v["top_k"],
                       calibrate=_flag(v["calibrate"], "evaluate.dots.calibrate")),
                {"method": "DOTS attention over the most recent observed prompts", **v})
        elif key == "ridge":
            add(B.RidgeReadout(embeddings),
                {"method": "ridge read-out of the embedding, evidence mixing (strengths chosen online)"})
        elif key == "labelprop":
            add(B.LabelPropagation(w), {"method": "label propagation (harmonic function)"})
        elif key == "sbr":
            add(B.SampleBeforeRL(n_nodes, probe=ev["oracles"]["probe"], seed=int(ev["oracles"]["seed"])),
                {"method": "ORACLE sample-before-RL", **ev["oracles"]})
        elif key == "sbs":
            add(B.SampleBeforeStep(n_nodes, probe=ev["oracles"]["probe"], seed=int(ev["oracles"]["seed"]) + 1),
                {"method": "ORACLE sample-before-step", **ev["oracles"]})
    return methods, described


def method_factories(keys, cfg, w, labels, k, embeddings, n_nodes) -> dict:
    """{method name: zero-argument factory of a fresh estimator} for the given method keys (the
    ``EMBEDDING_METHODS`` are left out without embeddings; discounted history at ``DISCOUNTED``, not tuned
    on the log)."""
    factories = {}
    for key in keys:
        if key not in COUNTERFACTUAL_METHODS:
            raise InvalidArgumentError(f"method {key!r} cannot drive decisions; choose from "
                                       f"{', '.join(COUNTERFACTUAL_METHODS)}")
        if key in EMBEDDING_METHODS and embeddings is None:
            continue
        built, _ = build_methods([key], cfg, w, labels, k, embeddings, n_nodes, tuned=DISCOUNTED)
        for idx, m in enumerate(built):
            factories[m.name] = (lambda key=key, idx=idx:
                                 build_methods([key], cfg, w, labels, k, embeddings, n_nodes, tuned=DISCOUNTED)[0][idx])
    return factories
