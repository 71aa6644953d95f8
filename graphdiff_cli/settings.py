"""Every estimator setting in one place: its default, its range, its one-line meaning, and the presets.

``EstimatorSettings`` is a pydantic model (chosen over a dataclass because the same declaration gives
validation with a precise message per field *and* the JSON schema that the workflow's config schema
includes, so the two cannot drift; ``tests/test_settings.py`` fails when the committed schema file is
not what this module generates). Everything that takes estimator settings derives from it: the
``Estimator`` keywords, ``graphdiff init``'s flags, and the one ``estimator:`` section shape that
``graphdiff init --config``, ``graphdiff evaluate --config`` and the Snakemake workflow read
(``config_layer`` finds it in a parsed file, ``resolve_layers`` resolves it; the workflow calls
``resolve_layers`` on its ``config["estimator"]``).

Two presets are named instances: ``paper`` (Sections 3.4-3.6 exactly: the field defaults below) and
``default`` (the paper's model with the improvements that measurements showed to help; docs/results.md).
``resolve(preset, **overrides)`` is the one way to get the settings of a run: the preset's, with the
given keys replaced. An override that cannot act under the resolved schedule or mixing (``tol`` under
the residual schedule, ``gamma`` under evidence mixing, ...) and asks for a value other than the
preset's or the setting's default is refused in one line instead of being silently ignored
(``inert_settings``).
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Callable, Literal, Optional, Union

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .core.meanfield import DEFAULT_EPSILON, SCHEDULES  # the numerics define what they run
from .errors import InvalidArgumentError

MIXINGS = ("gamma", "evidence", "offset")
STATE_PRIORS = ("uniform", "observed")
DTYPES = ("float32", "float64")

Strength = Union[Annotated[float, Field(gt=0)], Literal["auto"]]  # kappa, nu: rollouts, or chosen online


class EstimatorSettings(BaseModel):
    """The estimator's hyper-parameters, with the paper's names. The field defaults are the paper's."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, title="estimator settings")

    beta: float = Field(2.0, ge=0, description="Potts coupling strength beta (Section 3.3).")
    epsilon: float = Field(DEFAULT_EPSILON, gt=0, lt=1, description=(
        "Smoothing of the spectral prior A: a prompt's prior mass off its own cluster (Section 3.4)."))
    gamma: float = Field(0.5, ge=0, le=1, description=(
        "Weight of the model's prediction in p-hat against the prompt's own success rate (Section 3.6); "
        "acts only under mixing 'gamma'."))
    window: Optional[int] = Field(None, ge=1, description=(
        "Forget state-level outcomes older than L steps (Appendix G); null = cumulative (Section 3.4)."))
    max_iters: int = Field(50, ge=1, description="At most this many mean-field rounds per training step.")
    tol: float = Field(1e-6, ge=0, description=(
        "Synchronous/sequential schedules: stop when a round raises the ELBO by less than this per prompt."))
    schedule: Literal[SCHEDULES] = Field("synchronous", description=(
        "Mean-field schedule: synchronous (Jacobi, the paper's Algorithm 1), sequential (Gauss-Seidel, "
        "Eq. A.4) or residual (only rows whose inputs changed, to the same fixed point)."))
    residual_tol: float = Field(1e-4, gt=0, description=(
        "Residual schedule: revisit a prompt's neighbours when its q moved by more than this."))
    device: str = Field("auto", description="Where inference runs: auto (a GPU when one works), cpu, cuda, cuda:N.")
    dtype: Literal[DTYPES] = Field("float32", description="Floating type of q.")
    # -- beyond the paper (docs/explanation/estimator.md, "Improvements"); the defaults here reproduce the paper --
    mixing: Literal[MIXINGS] = Field("gamma", description=(
        "How p-hat combines the graph's estimate with the prompt's own outcomes: gamma (Section 3.6), "
        "evidence (p = (kappa p_graph + S) / (kappa + C)), offset (the prompt's offset from its states)."))
    prior_strength: Strength = Field(4.0, description=(
        "kappa, in rollouts: the weight of the graph's estimate under evidence/offset mixing, or 'auto' "
        "(chosen online by prequential absolute error)."))
    belief_strength: Optional[Strength] = Field(None, description=(
        "nu, in rollouts: the weight of the graph's estimate in the belief that decisions read (mean, "
        "variance, p_zero_variance), or 'auto' (prequential likelihood of whole groups); null = the "
        "mixing's own belief (Appendix E)."))
    prompt_forgetting: float = Field(1.0, gt=0, le=1, description=(
        "lambda in (0, 1]: a prompt's own counts decay by this at each of its visits (1 = keep all)."))
    time_forgetting: Union[Annotated[float, Field(gt=0, le=1)], Literal["auto"]] = Field(1.0, description=(
        "delta in (0, 1]: a prompt's own counts also decay by this at every step, visited or not (1 = only "
        "per visit), or 'auto' (chosen online among 1, 0.97, 0.9 by prequential absolute error)."))
    state_forgetting: float = Field(1.0, gt=0, le=1, description=(
        "rho in (0, 1]: state-level evidence decays by this at every step (1 = cumulative)."))
    state_prior: Literal[STATE_PRIORS] = Field("uniform", description=(
        "Prior of each state's success rate: uniform Beta(1, 1) (the paper) or observed (2 pseudo-rollouts "
        "at the recent global success rate)."))
    neighbor_smoothing: Optional[float] = Field(None, gt=0, description=(
        "tau, in rollouts: the graph's estimate adds the mutual neighbours' offsets from their own model "
        "predictions; null = off."))
    label_propagation: Optional[Union[Annotated[float, Field(ge=0, le=1)], Literal["auto"]]] = Field(None, description=(
        "Weight in [0, 1] of label propagation's harmonic estimate in the graph's estimate (the rest on the "
        "states' estimate), or 'auto' (chosen online, with kappa when kappa is 'auto', by prequential absolute "
        "error); null = off."))
    propagation_every: int = Field(1, ge=1, description=(
        "m >= 1: label propagation's field is solved at every m-th step (warm-started from its last solution); "
        "at the steps between, it keeps that solution with the step's observed prompts set to their new rates "
        "(1: solved at every step)."))
    readout: Optional[Union[Annotated[float, Field(ge=0, le=1)], Literal["auto"]]] = Field(None, description=(
        "Weight in [0, 1] of the ridge read-out of the prompt embedding in the graph's estimate, or 'auto' "
        "(chosen online with the other weights by prequential absolute error; off when the estimator has no "
        "embeddings); null = off."))
    readout_ridge: Strength = Field("auto", description=(
        "lambda > 0 of the ridge read-outs (the embedding's, the covariates' and live features': their slopes' "
        "penalty, in prompts), or 'auto' (chosen online among 1, 10, 100 by prequential absolute error, for each read-out)."))
    covariate_readout: Optional[Union[Annotated[float, Field(ge=0, le=1)], Literal["auto"]]] = Field(None, description=(
        "Weight in [0, 1] of the ridge read-out of the prompts' covariates (text statistics, the prompt file's "
        "fields, a reference pass rate) in the graph's estimate, or 'auto' (chosen online with the other weights; "
        "off when the estimator has no covariates); null = off."))
    live_readout: Optional[Union[Annotated[float, Field(ge=0, le=1)], Literal["auto"]]] = Field(None, description=(
        "Weight in [0, 1] of the ridge read-out of live features (per-prompt numbers the trainer observes at a "
        "step, e.g. the policy's next-token entropy at the prompt's end) in the graph's estimate, or 'auto' "
        "(chosen online with the other weights); a prompt read without live features has no live estimate; "
        "null = off."))
    live_forgetting: float = Field(0.9, gt=0, le=1, description=(
        "Per-step factor on the live read-out's sufficient statistics (1: never forget; 0.9: a memory of about "
        "10 steps), so that the map from live features to success follows the policy as it trains."))

    @field_validator("beta", "epsilon", "gamma", "tol", "residual_tol", "prompt_forgetting", "state_forgetting",
                     "neighbor_smoothing", "live_forgetting", mode="before")
    @classmethod
    def _number(cls, v):
        # strict mode refuses ints for floats; a YAML "2", a Python 2 or a numpy number means 2.0.
        # Booleans stay refused.
        if isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_)):
            return float(v)
        return v

    @field_validator("window", "max_iters", "propagation_every", mode="before")
    @classmethod
    def _integer(cls, v):
        if isinstance(v, np.integer):
            return int(v)
        return v

    @field_validator("prior_strength", "belief_strength", "readout_ridge", mode="before")
    @classmethod
    def _strength(cls, v):
        if isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_)):
            v = float(v)
        if isinstance(v, float) and not (math.isfinite(v) and v > 0):
            raise ValueError(f"must be a number > 0 or 'auto', got {v!r}")
        return v

    @field_validator("time_forgetting", "label_propagation", "readout", "covariate_readout", "live_readout",
                     mode="before")
    @classmethod
    def _unit(cls, v, info):
        # a share in (0, 1] (time_forgetting) or [0, 1] (label_propagation, readout, covariate_readout), or 'auto' (or null)
        if isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_)):
            v = float(v)
            low_ok = v > 0 if info.field_name == "time_forgetting" else v >= 0
            if not (math.isfinite(v) and low_ok and v <= 1):
                what = "(0, 1] or 'auto'" if info.field_name == "time_forgetting" else "[0, 1], 'auto' or null"
                raise ValueError(f"must be a number in {what}, got {v!r}")
        return v

    @field_validator("beta", "tol", "neighbor_smoothing")
    @classmethod
    def _finite(cls, v):
        if v is not None and not math.isfinite(v):
            raise ValueError(f"must be finite, got {v!r}")
        return v

    @field_validator("device")
    @classmethod
    def _device(cls, v):
        from .backends.device import check_device_name

        check_device_name(v)
        return v

    @model_validator(mode="after")
    def _compatible(self):
        if self.window is not None and self.state_forgetting != 1.0:
            raise ValueError("choose either a window or state_forgetting < 1, not both")
        return self

    @property
    def paper_exact(self) -> bool:
        """True when the state-level Beta update is the paper's (cumulative or windowed, Beta(1, 1))."""
        return self.state_forgetting == 1.0 and self.state_prior == "uniform"

    def as_dict(self) -> dict[str, Any]:
        return self.model_dump()


NAMES = tuple(EstimatorSettings.model_fields)
# settings whose null is a value of its own (cumulative, Appendix E's belief, off); given as "none"
NULLABLE = tuple(n for n in NAMES if n in ("window", "belief_strength", "neighbor_smoothing", "label_propagation",
                                           "readout", "covariate_readout", "live_readout"))
PRESET_HELP = ("Named settings: default (the paper's model with the measured improvements of docs/results.md) or "
               "paper (Sections 3.4-3.6 exactly); the settings given override it.")

# The named settings. "paper" is the field defaults: Sections 3.4-3.6 exactly (tests hold it to that).
# "default" is what `Estimator(...)`, `graphdiff init` and `graphdiff evaluate` use unless told
# otherwise: the paper's model with the measured improvements of docs/results.md.
PRESETS: dict[str, EstimatorSettings] = {
    "default": EstimatorSettings(schedule="residual", mixing="evidence", prior_strength="auto",
                                 belief_strength="auto", prompt_forgetting=0.85, state_prior="observed",
                                 neighbor_smoothing=4.0, label_propagation="auto", time_forgetting="auto",
                                 readout="auto", covariate_readout="auto", live_readout="auto"),
    "paper": EstimatorSettings(),
}
DEFAULT_PRESET = "default"


def inert_settings(settings: EstimatorSettings) -> dict[str, str]:
    """{setting: why it has no effect} for the settings these ``settings`` never read."""
    out = {}
    if settings.schedule == "residual":
        out["tol"] = "it stops the synchronous and sequential schedules; the residual schedule stops by residual_tol"
    else:
        out["residual_tol"] = f"it only steers the residual schedule, not {settings.schedule!r}"
    if settings.mixing != "gamma":
        out["gamma"] = f"it weights p-hat only under mixing 'gamma', not {settings.mixing!r}"
    else:
        out["prior_strength"] = "kappa weights p-hat only under mixing 'evidence' or 'offset', not 'gamma'"
        if settings.belief_strength is None and settings.neighbor_smoothing is None \
                and settings.label_propagation is None and settings.readout is None and settings.covariate_readout is None:
            why = ("the forgotten counts feed evidence/offset mixing, the belief (belief_strength), neighbour "
                   "smoothing, label propagation and the read-outs, none of which is on")
            out["prompt_forgetting"] = out["time_forgetting"] = why
    if settings.mixing == "offset":
        out["time_forgetting"] = "offset mixing keeps per-visit offsets that a per-step decay would unbalance"
    if settings.label_propagation is None:
        out["propagation_every"] = "it schedules label propagation's solve, which is off (label_propagation null)"
    if settings.readout is None and settings.covariate_readout is None and settings.live_readout is None:
        out["readout_ridge"] = "it shapes the read-outs of the embedding, the covariates and live features, all off"
    if settings.live_readout is None:
        out["live_forgetting"] = "it forgets the live read-out's statistics, which is off (live_readout null)"
    if settings.schedule == "sequential":
        out["device"] = "the sequential schedule (Gauss-Seidel) runs on the CPU only (cpu or auto are fine)"
    return out


def _check_preset(preset) -> str:
    if preset is None:
        return DEFAULT_PRESET
    if not isinstance(preset, str) or preset not in PRESETS:
        raise InvalidArgumentError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    return preset


_BOUNDS = {"greater_than_equal": (">=", "ge"), "greater_than": (">", "gt"), "less_than_equal": ("<=", "le"),
           "less_than": ("<", "lt")}


def _one_line(exc: ValidationError, where: str) -> InvalidArgumentError:
    """pydantic's first error as one line in graphdiff's words: "<where>beta must be >= 0, got -1.0"."""
    err = exc.errors()[0]
    loc = str(err["loc"][0]) if err["loc"] else ""  # the setting (deeper parts name union members)
    kind, ctx, value = err["type"], err.get("ctx") or {}, err.get("input")
    if kind == "extra_forbidden":
        return InvalidArgumentError(f"{where}unknown setting {loc!r}; known: {', '.join(NAMES)}")
    if kind == "literal_error":
        choices = ", ".join(str(c) for c in EstimatorSettings.model_fields[loc].annotation.__args__)
        return InvalidArgumentError(f"{where}unknown {loc} {value!r}; choose one of {choices}")
    if kind in _BOUNDS:
        op, key = _BOUNDS[kind]
        msg = f"must be {op} {ctx[key]}"
    elif kind.startswith(("float", "int", "bool")):
        msg = "must be an integer" if kind.startswith("int") else "must be a number"
        if loc in ("prior_strength", "belief_strength", "readout_ridge"):
            msg = "must be a number > 0 or 'auto'"
        if loc == "time_forgetting":
            msg = "must be a number in (0, 1] or 'auto'"
        if loc in ("label_propagation", "readout", "covariate_readout", "live_readout"):
            msg = "must be a number in [0, 1] or 'auto'"
        if loc in NULLABLE:
            msg += " or null"
    else:
        msg = err["msg"].removeprefix("Value error, ")
    if not loc:
        return InvalidArgumentError(f"{where}{msg}")
    if not msg.startswith("must"):  # a validator's own sentence (e.g. the device check)
        return InvalidArgumentError(f"{where}{loc}: {msg}")
    shown = f", got {value!r}" if "got" not in msg else ""
    return InvalidArgumentError(f"{where}{loc} {msg}{shown}")


def resolve(preset: str | None = None, where: str = "", **overrides) -> EstimatorSettings:
    """The settings of ``preset`` ("default" when None) with ``overrides`` replacing its values.

    Unknown names, values out of range and overrides that cannot act under the resolved schedule or
    mixing (and differ from the preset's value and the setting's default) raise ``InvalidArgumentError`` with one line, prefixed
    by ``where`` (e.g. the config file and line, or the flag).
    """
    return resolve_layers([({"preset": preset, **overrides}, lambda key: where)])


def resolve_layers(layers) -> EstimatorSettings:
    """Settings from layers of ``(values, where)``, later layers winning: e.g. a config file, then the
    command-line flags. ``values`` may hold ``preset`` (the last layer that names one picks the base);
    a value of None means "not given" except for a key present with None in a file (a null setting).
    ``where(key)`` names where a key came from ("cfg.yaml:3", "--beta") for the one-line errors."""
    preset, overrides, origin = None, {}, {}
    for values, where in layers:
        for key, value in values.items():
            if key == "preset":
                if value is not None:
                    preset, origin["preset"] = value, where(key)
                continue
            overrides[key], origin[key] = value, where(key)
    try:
        name = _check_preset(preset)
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(f"{origin['preset']}: {exc}" if origin.get("preset") else str(exc)) from None
    origin.pop("preset", None)
    base = PRESETS[name]
    try:
        settings = EstimatorSettings(**{**base.model_dump(), **overrides})
    except ValidationError as exc:
        key = str(exc.errors()[0]["loc"][0]) if exc.errors()[0]["loc"] else ""
        place = origin.get(key) or ", ".join(sorted({w for w in origin.values() if w}))
        raise _one_line(exc, f"{place}: " if place else "") from None
    inert = inert_settings(settings)
    for key, value in overrides.items():
        # a value that is the preset's or the field's own default is no request (a whole preset's
        # settings dict may be passed back as keywords); anything else would be silently ignored
        harmless = (getattr(base, key), EstimatorSettings.model_fields[key].default) + (("cpu",) if key == "device" else ())
        if key in inert and value not in harmless:
            place = f"{origin[key]}: " if origin[key] else ""
            raise InvalidArgumentError(f"{place}{key} = {value!r} has no effect here: {inert[key]} "
                                       f"(preset {name!r}, schedule {settings.schedule!r}, mixing {settings.mixing!r})")
    return settings


def parse_flag(name: str, text):
    """A setting's value from command-line text (the one parser of flag text: every setting flag is
    text): numbers, 'auto', and 'none'/'null' for the settings that may be null (window,
    belief_strength, neighbor_smoothing, label_propagation). Checking is ``resolve``'s job."""
    if not isinstance(text, str):
        return text
    field = EstimatorSettings.model_fields[name]
    if name in NULLABLE and text.strip().lower() in ("none", "null"):
        return None
    from pydantic import TypeAdapter

    try:
        return TypeAdapter(field.annotation).validate_python(text, strict=False)
    except ValidationError:
        return text  # resolve refuses it with the setting's own message


SECTION = "estimator"
KNOWN_KEYS = ("preset", *NAMES)  # the keys of an estimator section
# keys that used to ride in the section but belong elsewhere: refused with where they went
MOVED = {"keep": "keep is the STATE's retention, not an estimator setting: give graphdiff init --keep N "
                 "(the workflow: state.keep)"}


def config_layer(data: dict, lines: dict, path, sections: tuple = ()) -> tuple[dict, Callable[[str], str]]:
    """(values, where) of the estimator section of a parsed config file (``data, lines`` as
    ``io.readers.read_mapping`` gives them), for ``resolve_layers``.

    One shape, two ways to hold it: a file with a top-level ``estimator:`` key (or one of the caller's
    own ``sections``, e.g. evaluate's ``evaluate``) is a whole config (a Snakemake config file, evaluate's
    config) and its ``estimator`` section is read, other top-level keys left to their readers; a file
    without one must be only the section's content (``preset`` and settings: e.g. an older
    ``init --config`` file, whose keys may also be spelled as the flags, ``max-iters``), and any other
    key in it is refused. In a section, keys are spelled as in the workflow's schema (``max_iters``).
    Unknown keys, a misplaced ``keep`` and a non-mapping section are refused in
    one line naming the file and line."""
    if SECTION in data or any(name in data for name in sections):
        section, prefix = data.get(SECTION), f"{SECTION}."
        if section is None:
            section = {}
        if not isinstance(section, dict):
            raise InvalidArgumentError(f"{path}:{lines.get(SECTION, 1)}: section {SECTION!r} must be a mapping "
                                       f"(a preset and settings), got {type(section).__name__}")
        whole = True
    else:
        section, prefix, whole = data, "", False
    out, where_of = {}, {}
    for raw, value in section.items():
        # a file of only the section's keys is also the older init --config shape, which spelled them as
        # the flags do (max-iters); in a section they are spelled as the workflow's schema spells them
        key = str(raw) if whole else str(raw).replace("-", "_")
        where = f"{path}:{lines.get(prefix + key, lines.get(SECTION, 1) if whole else 1)}"
        if key in MOVED:
            raise InvalidArgumentError(f"{where}: {MOVED[key]}")
        if key not in KNOWN_KEYS:
            hint = ""
            if key.replace("-", "_") in KNOWN_KEYS:
                hint = f" (settings are spelled with underscores: {key.replace('-', '_')})"
            elif not whole:
                hint = f" (the file has no {SECTION!r} section, so every key must be one of its settings)"
            raise InvalidArgumentError(f"{where}: unknown setting {prefix + str(raw)!r}{hint}; known: "
                                       f"{', '.join(KNOWN_KEYS)}")
        out[key], where_of[key] = value, where
    fallback = f"{path}: {SECTION}" if whole else str(path)
    return out, lambda key: where_of.get(key, fallback)


def from_dict(values: dict, where: str = "") -> EstimatorSettings:
    """Settings saved whole (a STATE's config): every value as given, checked, no preset involved."""
    try:
        return EstimatorSettings(**values)
    except ValidationError as exc:
        raise _one_line(exc, f"{where}: " if where else "") from None


def preset_settings(name: str) -> dict[str, Any]:
    """Every setting of the preset ``name`` as a plain dict (the keyword form ``Estimator`` accepts)."""
    return PRESETS[_check_preset(name)].model_dump()


def preset_of(values: dict) -> tuple[str, dict[str, Any]]:
    """(the preset these saved settings are closest to, {setting: value} where they differ from it): how
    ``status`` names a STATE's configuration (a STATE stores its settings whole, not the preset)."""
    mine = {k: v for k, v in values.items() if k in EstimatorSettings.model_fields}
    best = None
    for name, preset in PRESETS.items():
        ref = preset.model_dump()
        diff = {k: v for k, v in mine.items() if k != "device" and ref.get(k) != v}
        if best is None or len(diff) < len(best[1]):
            best = (name, diff)
    return best


def json_schema() -> dict:
    """The JSON schema of the ``estimator`` section (the workflow config's, and the one init --config and
    evaluate --config read): ``preset`` and every setting; a setting left out takes the preset's value.
    Generated from ``EstimatorSettings``."""
    props = {}
    for name, prop in EstimatorSettings.model_json_schema()["properties"].items():
        prop = {k: v for k, v in prop.items() if k not in ("default", "title")}
        per_preset = ", ".join(f"{p} {show_value(getattr(s, name))}" for p, s in PRESETS.items())
        prop["description"] = f"{prop['description']} Left out: the preset's ({per_preset})."
        props[name] = prop
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "estimator",
        "description": ("graphdiff's estimator settings (generated from graphdiff_cli/settings.py by "
                        "`graphdiff settings --schema`; do not edit by hand): a preset and the keys that override it."),
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "preset": {"description": f"{PRESET_HELP} Left out: {DEFAULT_PRESET}.", "enum": list(PRESETS)},
            **props,
        },
    }


def show_value(v) -> str:
    """A setting's value as the docs and --help print it (null, 0.85, auto)."""
    return "null" if v is None else (f"{v:g}" if isinstance(v, float) else str(v))


def describe() -> list[dict[str, Any]]:
    """One row per setting: name, meaning, and its value in each preset (for `graphdiff settings`)."""
    schema = EstimatorSettings.model_json_schema()["properties"]
    return [{"name": name, **{p: getattr(s, name) for p, s in PRESETS.items()},
             "description": schema[name]["description"]} for name in NAMES]
