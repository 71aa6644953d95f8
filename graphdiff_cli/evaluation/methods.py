"""The method registry: every estimator that ``evaluate``, the counterfactual replay and the benchmarks
compare, built by key from one config. Each method registers itself (``registry.register``, on its class:
graphdiff's ``registry.GraphdiffMethod``, the peers' in ``baselines``); everything here is read from it.

- ``METHOD_KEYS``: graphdiff, the peers (history, discounted history, MoPPS, GRESO, the embedding peers
  VIP, DOTS and the ridge read-out, label propagation) and the two oracles, in report order;
  ``parse_methods`` reads ``--methods``. ``EMBEDDING_METHODS`` need prompt embeddings: without them
  ``build_methods`` refuses them and ``method_factories`` leaves them out; ``COVARIATE_METHODS`` (the
  covariates' read-out alone, the reference pass rate's prior) need the prompts' covariates, likewise.
  ``COUNTERFACTUAL_METHODS`` can
  drive decisions (no oracles). Each is read from the registry when asked for, so a method registered
  later is among them.
- ``load_config``: the ``estimator`` section (graphdiff's settings, read by ``settings.config_layer`` as
  init reads it) and the peers' settings (``DEFAULT_CONFIG``, the registered defaults; the workflow's
  ``evaluate.settings``) of a YAML/JSON file shaped like the Snakemake config.
- ``build_methods``: fresh estimators for the keys; ``method_factories``: zero-argument factories of
  fresh ones (a counterfactual replay needs one per strategy).
"""

from __future__ import annotations

from pathlib import Path

from ..errors import InvalidArgumentError
from . import baselines as _peers  # noqa: F401  (the peers register themselves on import)
from .baselines import DISCOUNTED
from .registry import (METHODS, GraphdiffMethod, Inputs, counterfactual_keys, covariate_keys, default_settings,
                       embedding_keys, method_keys, methods_help, oracle_keys)

__all__ = ["METHOD_KEYS", "ORACLE_KEYS", "EMBEDDING_METHODS", "COVARIATE_METHODS", "COUNTERFACTUAL_METHODS", "DEFAULT_CONFIG", "DISCOUNTED",
           "METHODS", "GraphdiffMethod", "Inputs", "method_keys", "oracle_keys", "embedding_keys", "covariate_keys",
           "counterfactual_keys", "default_settings", "methods_help", "load_config", "with_device", "parse_methods",
           "tune_discounted", "build_methods", "method_factories"]

# the registry's views, computed when read (a method registered after this import is among them)
_VIEWS = {"METHOD_KEYS": method_keys, "ORACLE_KEYS": oracle_keys, "EMBEDDING_METHODS": embedding_keys,
          "COVARIATE_METHODS": covariate_keys,
          "COUNTERFACTUAL_METHODS": counterfactual_keys, "DEFAULT_CONFIG": lambda: {"evaluate": default_settings()}}


def __getattr__(name: str):
    if name in _VIEWS:
        return _VIEWS[name]()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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

    cfg = {"evaluate": default_settings()}
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
    keys_known = method_keys()
    if not methods:
        return list(keys_known)
    keys = []
    for item in methods:
        for key in str(item).split(","):
            key = key.strip().lower()
            if not key:
                continue
            if key == "all":
                return list(keys_known)
            if key not in keys_known:
                raise InvalidArgumentError(f"unknown method {key!r}; choose from {', '.join(keys_known)}")
            if key not in keys:
                keys.append(key)
    if not keys:
        raise InvalidArgumentError("--methods names no method")
    return [k for k in keys_known if k in keys]


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


def build_methods(keys, cfg, w, labels, k, embeddings, n_nodes, tuned=None, covariates=None,
                  reference=None) -> tuple[list, dict]:
    """Instantiate the requested methods (``registry.METHODS[key].build``); returns (estimators, {name:
    description of its settings}). ``tuned``: discounted history's (lambda, m) (None: ``DISCOUNTED``);
    ``covariates``, ``reference``: the prompts' encoded covariates and reference pass rate (None: not given)."""
    ev = cfg["evaluate"]
    inputs = Inputs(w, labels, k, embeddings, n_nodes, estimator=cfg["estimator"],
                    preset=cfg.get("estimator_preset", "default"), tuned=tuned, covariates=covariates,
                    reference=None if covariates is None else reference)
    methods, described = [], {}
    for key in keys:
        spec = METHODS.get(key)
        if spec is None:
            raise InvalidArgumentError(f"unknown method {key!r}; choose from {', '.join(method_keys())}")
        if spec.embeddings and embeddings is None:
            raise InvalidArgumentError(f"method {key} needs prompt embeddings: pass --embeddings EMBED.zarr")
        if spec.covariates and covariates is None:
            raise InvalidArgumentError(f"method {key} needs the prompts' covariates: pass --covariates with an "
                                       "embeddings artifact that holds them (graphdiff embed with covariates)")
        for m, desc in spec.build(inputs, None if spec.settings is None else ev[spec.section]):
            methods.append(m)
            described[m.name] = desc
    return methods, described


def method_factories(keys, cfg, w, labels, k, embeddings, n_nodes, covariates=None, reference=None) -> dict:
    """{method name: zero-argument factory of a fresh estimator} for the given method keys (the embedding
    methods are left out without embeddings, the covariate methods without covariates; discounted history at
    ``DISCOUNTED``, not tuned on the log)."""
    factories = {}
    for key in keys:
        if key not in counterfactual_keys():
            raise InvalidArgumentError(f"method {key!r} cannot drive decisions; choose from "
                                       f"{', '.join(counterfactual_keys())}")
        if (METHODS[key].embeddings and embeddings is None) or (METHODS[key].covariates and covariates is None):
            continue
        extra = {"covariates": covariates, "reference": reference}
        built, _ = build_methods([key], cfg, w, labels, k, embeddings, n_nodes, tuned=DISCOUNTED, **extra)
        for idx, m in enumerate(built):
            factories[m.name] = (lambda key=key, idx=idx:
                                 build_methods([key], cfg, w, labels, k, embeddings, n_nodes, tuned=DISCOUNTED,
                                               **extra)[0][idx])
    return factories
