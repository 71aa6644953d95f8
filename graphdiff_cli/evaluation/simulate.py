"""Synthetic RLVR trajectories with a known ground truth, for testing and comparing estimators.

Model. Each prompt i has a topic u(i) and a level l(i) in 1..5 and a latent difficulty
    d_i = topic_offset[u] + LEVEL_SLOPE * (l - 3) + sigma * eps_i,      eps_i ~ N(0, 1).
The policy's ability on topic u after a fraction x = t / (T - 1) of training (t = 0..T-1) is
    a_u(x) = ABILITY0 + gain_u * (1 - exp(-x / tau_u)),
so topics improve by different amounts and at different speeds (gain_u, tau_u below, jittered per
seed). The probability that one rollout of prompt i at step t succeeds is
    p_it = sigmoid(a_u(i)(x_t) - d_i),
and its group of n rollouts succeeds s_it ~ Binomial(n, p_it) times. A ``Shift`` (step T, topic u, delta)
moves a_u by delta from step T on: a jump (a skill the policy suddenly acquires, delta > 0) or a decay
(one it forgets while training on something else, delta < 0), the moving policy estimators must follow. Batches of B prompts are drawn
epoch-wise without replacement (a fresh permutation each epoch, the last partial batch dropped as
verl's ``drop_last`` does). Everything is drawn from one ``numpy.random.default_rng(seed)``, so a seed
fixes the prompts, the difficulties, the batches and the outcomes.

``simulate`` writes prompts from the templates below (5 topics x 5 levels, numbers filled in);
``simulate_math`` takes MATH training rows (subject, level) and lets difficulty follow the real level
and subject.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import DataError, InvalidArgumentError

LEVELS = (1, 2, 3, 4, 5)
LEVEL_SLOPE = 0.8
ITEM_SIGMA = 0.6
ABILITY0 = -0.4
# (difficulty offset, ability gain over training, time constant as a fraction of training)
TOPICS = {
    "arithmetic": (-1.0, 0.6, 0.25),
    "algebra": (0.0, 1.6, 0.5),
    "geometry": (0.5, 0.7, 0.9),
    "counting": (0.8, 0.4, 0.4),
    "number_theory": (0.6, 1.1, 0.6),
}
MATH_SUBJECTS = {
    "Prealgebra": (-0.6, 0.7, 0.3),
    "Algebra": (-0.3, 1.3, 0.5),
    "Number Theory": (0.2, 1.0, 0.6),
    "Counting & Probability": (0.3, 0.6, 0.5),
    "Geometry": (0.5, 0.5, 0.8),
    "Intermediate Algebra": (0.7, 0.9, 0.7),
    "Precalculus": (0.6, 0.8, 0.6),
}
UNKNOWN_LEVEL = 3  # MATH has two rows labelled "Level ?": they get the middle level's difficulty


@dataclass(frozen=True)
class Shift:
    """From step ``step`` (1-based, as in the log) on, the ability on ``topic`` is moved by ``delta``
    logits: > 0 a jump (the policy acquires the skill), < 0 a decay (it forgets it)."""

    step: int
    topic: str
    delta: float

    @classmethod
    def parse(cls, text: str) -> "Shift":
        """'STEP:TOPIC:DELTA', e.g. '50:algebra:+2' or '50:Number Theory:-1.5'."""
        parts = str(text).split(":")
        if len(parts) != 3:
            raise InvalidArgumentError(f"a shift is STEP:TOPIC:DELTA (e.g. 50:algebra:+2), got {text!r}")
        try:
            step, delta = int(parts[0]), float(parts[2])
        except ValueError:
            raise InvalidArgumentError(f"a shift is STEP:TOPIC:DELTA with an integer step and a number delta, "
                                       f"got {text!r}") from None
        if not np.isfinite(delta):
            raise InvalidArgumentError(f"a shift's delta must be finite, got {text!r}")
        return cls(step, parts[1].strip(), delta)


def apply_shifts(ability: np.ndarray, topics: list[str], shifts) -> np.ndarray:
    """``ability`` (T x topics, row t = step t + 1) with every shift applied from its step on."""
    out = np.array(ability, dtype=np.float64, copy=True)
    steps = out.shape[0]
    for sh in shifts:
        if sh.topic not in topics:
            raise InvalidArgumentError(f"shift {sh.step}:{sh.topic}:{sh.delta:+g}: unknown topic {sh.topic!r}; "
                                       f"topics are {', '.join(topics)}")
        if not 1 <= sh.step <= steps:
            raise InvalidArgumentError(f"shift {sh.step}:{sh.topic}:{sh.delta:+g}: the step must lie in "
                                       f"[1, {steps}]")
        out[sh.step - 1:, topics.index(sh.topic)] += sh.delta
    return out


@dataclass
class Simulation:
    """A simulated trajectory.

    prompts: list of {"id", "prompt", "topic", "level", "difficulty"} (node index = list position).
    Log arrays, one entry per (step, prompt) row, grouped by step: step (1-based), id (node index),
    n, s, p_true (the success probability the outcome was drawn from). ability: T x topics array of
    a_u at every step, topics in ``topics`` order.
    """

    prompts: list[dict]
    step: np.ndarray
    id: np.ndarray
    n: np.ndarray
    s: np.ndarray
    p_true: np.ndarray
    topics: list[str]
    ability: np.ndarray
    params: dict = field(default_factory=dict)

    def log_rows(self) -> list[dict]:
        """The log as rows {"step", "id" (the prompt's string id), "n", "s"}."""
        pid = [p["id"] for p in self.prompts]
        return [{"step": int(t), "id": pid[i], "n": int(n), "s": int(s)}
                for t, i, n, s in zip(self.step, self.id, self.n, self.s)]


# ----------------------------------------------------------------------------------------------------
# prompt templates: one generator per (topic, level); larger numbers and more steps at higher levels


def _arithmetic(level, r):
    if level == 1:
        return f"What is {r.integers(2, 50)} + {r.integers(2, 50)}?"
    if level == 2:
        return f"Compute {r.integers(12, 99)} \\times {r.integers(3, 19)}."
    if level == 3:
        a, b, c, d = r.integers(10, 90, size=4)
        return f"Evaluate {a} - {b} \\times {r.integers(2, 9)} + {c} \\div {d % 7 + 1} without a calculator."
    if level == 4:
        a, c = r.integers(1, 12, size=2)
        b, d = r.integers(a + 1, 25), r.integers(c + 1, 25)
        return (f"Compute \\frac{{{a}}}{{{b}}} + \\frac{{{c}}}{{{d}}} and write the answer as a fraction in "
                "lowest terms.")
    a, b = r.integers(20, 99), r.integers(2, 19)
    return (f"Without a calculator, evaluate \\frac{{{a}^2 - {b}^2}}{{{a} - {b}}} + {r.integers(2, 9)}^3 "
            f"- \\sqrt{{{r.integers(2, 30) ** 2}}}.")


def _algebra(level, r):
    if level == 1:
        return f"Solve for $x$: $x + {r.integers(1, 40)} = {r.integers(41, 99)}$."
    if level == 2:
        return f"Solve for $x$: ${r.integers(2, 12)}x - {r.integers(1, 50)} = {r.integers(1, 90)}$."
    if level == 3:
        u, v = r.integers(1, 61, size=2)
        return f"Find all real $x$ such that $x^2 - {u + v}x + {u * v} = 0$."
    if level == 4:
        a, b, c, d = r.integers(1, 6), r.integers(1, 9), r.integers(1, 20), r.integers(-3, 4)
        return f"If $f(x) = {a}x^2 + {b}x - {c}$, what is $f(f({d}))$?"
    a, b, c = r.integers(3, 15), r.integers(1, 30), r.integers(1, 12)
    return f"Find the sum of all real solutions of $|x^2 - {a}x + {b}| = {c}$."


def _geometry(level, r):
    if level == 1:
        return f"A rectangle has length {r.integers(2, 40)} and width {r.integers(2, 40)}. What is its area?"
    if level == 2:
        k = r.integers(1, 60)
        a, b = [(3, 4), (5, 12), (8, 15), (7, 24)][r.integers(0, 4)]
        unit = ["cm", "inches", "meters", "units"][r.integers(0, 4)]
        return f"A right triangle has legs {a * k} {unit} and {b * k} {unit}. What is the length of its hypotenuse?"
    if level == 3:
        what = ["circumference", "diameter"][r.integers(0, 2)]
        return f"A circle has {what} ${2 * r.integers(2, 400)}\\pi$. What is its area, in terms of $\\pi$?"
    if level == 4:
        a, b = r.integers(5, 20, size=2)
        c = r.integers(abs(a - b) + 1, a + b)
        return f"In triangle $ABC$, $AB = {a}$, $BC = {b}$ and $CA = {c}$. Find the area of triangle $ABC$."
    return (f"A sphere of radius {r.integers(2, 400)} is inscribed in a cube, and the cube is inscribed in a "
            "second sphere. Find the ratio of the volume of the second sphere to that of the first, and the "
            "surface area of the cube.")


def _counting(level, r):
    if level == 1:
        obj = ["books", "flags", "coins", "cards", "chairs", "lamps", "paintings", "toys", "keys", "vases"]
        where = ["on a shelf", "in a row", "in a line", "in a display case"]
        return (f"In how many ways can {r.integers(3, 13)} different {obj[r.integers(0, 10)]} be arranged "
                f"{where[r.integers(0, 4)]}?")
    if level == 2:
        who = ["people", "students", "teachers", "players", "doctors", "engineers"][r.integers(0, 6)]
        return f"In how many ways can a committee of {r.integers(2, 7)} be chosen from {r.integers(7, 31)} {who}?"
    if level == 3:
        words = ["PRIME", "GRAPHS", "NUMBER", "DOUBLE", "FACTOR", "VECTOR", "MATRIX", "PLANET", "SQUARE",
                 "CIRCLE", "BRIDGE", "FORMAT", "JUNGLE", "ORANGE", "WINTER", "CASTLE"]
        rule = ["if no letter is used twice", "if letters may be repeated", "that start with a consonant"]
        return (f"How many {r.integers(2, 7)}-letter strings can be formed from the letters of the word "
                f"{words[r.integers(0, 16)]} {rule[r.integers(0, 3)]}?")
    if level == 4:
        d, k = r.integers(4, 21), r.integers(2, 4)
        rel = ["exactly", "at least"][r.integers(0, 2)]
        return (f"{['Two', 'Three'][k - 2]} fair {d}-sided dice are rolled. What is the probability that the "
                f"sum is {rel} {r.integers(k + 1, k * d)}?")
    k, m = r.integers(3, 10), r.integers(1, 6)
    obj = ["balls", "candies", "marbles", "coins"][r.integers(0, 4)]
    return (f"In how many ways can {k * m + r.integers(2, 40)} identical {obj} be placed into {k} distinct "
            f"boxes so that every box holds at least {m} {obj}?")


def _number_theory(level, r):
    if level == 1:
        return f"What is the remainder when {r.integers(20, 500)} is divided by {r.integers(3, 12)}?"
    if level == 2:
        g = r.integers(2, 20)
        return f"What is the greatest common divisor of {g * r.integers(2, 30)} and {g * r.integers(2, 30)}?"
    if level == 3:
        return f"How many positive divisors does {r.integers(30, 2000)} have?"
    if level == 4:
        m = [7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47][r.integers(0, 12)]
        return (f"Find the smallest positive integer $x$ such that ${r.integers(2, m)}x \\equiv "
                f"{r.integers(1, m)} \\pmod{{{m}}}$.")
    return (f"What is the remainder when ${r.integers(2, 40)}^{{{r.integers(50, 2025)}}}$ is divided by "
            f"{r.integers(7, 100)}?")


TEMPLATES = {"arithmetic": _arithmetic, "algebra": _algebra, "geometry": _geometry,
             "counting": _counting, "number_theory": _number_theory}


def write_prompt(topic: str, level: int, rng: np.random.Generator) -> str:
    """One templated problem of ``topic`` at ``level`` (1..5) with numbers drawn from ``rng``."""
    if topic not in TEMPLATES:
        raise InvalidArgumentError(f"unknown topic {topic!r}; choose one of {', '.join(TEMPLATES)}")
    if level not in LEVELS:
        raise InvalidArgumentError(f"level must be one of 1..5, got {level!r}")
    return TEMPLATES[topic](level, rng)


# ----------------------------------------------------------------------------------------------------
# the trajectory


def _check_sizes(n_prompts: int, steps: int, batch_size: int, rollouts: int) -> None:
    for name, v in (("prompts", n_prompts), ("steps", steps), ("batch size", batch_size), ("rollouts", rollouts)):
        if not isinstance(v, (int, np.integer)) or v < 1:
            raise InvalidArgumentError(f"{name} must be a positive integer, got {v!r}")
    if batch_size > n_prompts:
        raise InvalidArgumentError(f"batch size {batch_size} is larger than the {n_prompts} prompts")


def ability_curves(steps: int, gains: np.ndarray, taus: np.ndarray) -> np.ndarray:
    """a_u(x_t) for t = 0..T-1 (rows) and every topic (columns); x_t = t / (T - 1), 0 for T = 1."""
    x = np.arange(steps) / max(steps - 1, 1)
    return ABILITY0 + gains[None, :] * (1.0 - np.exp(-x[:, None] / taus[None, :]))


def epoch_batches(n_prompts: int, steps: int, batch_size: int, rng: np.random.Generator) -> np.ndarray:
    """steps x B node indices: epoch-wise permutations cut into full batches (remainder dropped)."""
    per_epoch = n_prompts // batch_size
    out = []
    while len(out) < steps:
        perm = rng.permutation(n_prompts)
        out.extend(perm[j * batch_size:(j + 1) * batch_size] for j in range(per_epoch))
    return np.stack(out[:steps])


def _trajectory(topic_idx, difficulty, table, steps, batch_size, rollouts, rng, shifts=()):
    gains = np.array([v[1] for v in table.values()], dtype=np.float64)
    taus = np.array([v[2] for v in table.values()], dtype=np.float64)
    # seeded jitter: the same design, a slightly different policy per seed
    gains = gains * rng.uniform(0.85, 1.15, size=gains.size)
    taus = taus * rng.uniform(0.85, 1.15, size=taus.size)
    ability = apply_shifts(ability_curves(steps, gains, taus), list(table), shifts)  # draws nothing
    batches = epoch_batches(topic_idx.size, steps, batch_size, rng)
    step = np.repeat(np.arange(1, steps + 1), batch_size)
    ids = batches.reshape(-1)
    logit = ability[step - 1, topic_idx[ids]] - difficulty[ids]
    p = 1.0 / (1.0 + np.exp(-logit))
    s = rng.binomial(rollouts, p)
    n = np.full(ids.size, rollouts, dtype=np.int64)
    return step.astype(np.int64), ids.astype(np.int64), n, s.astype(np.int64), p, ability


def simulate(n_prompts: int = 2000, steps: int = 100, batch_size: int = 128, rollouts: int = 8,
             seed: int = 0, shifts=()) -> Simulation:
    """A trajectory over templated prompts: topics and levels assigned round-robin (balanced). ``shifts``
    (``Shift``s) move topics' abilities mid-run; they draw no random numbers, so the same seed gives the
    same prompts, batches and, until the first shift, outcomes."""
    _check_sizes(n_prompts, steps, batch_size, rollouts)
    rng = np.random.default_rng(seed)
    names = list(TOPICS)
    cells = [(u, lvl) for u in range(len(names)) for lvl in LEVELS]
    cell = rng.permutation(np.arange(n_prompts) % len(cells))
    topic_idx = np.array([cells[c][0] for c in cell], dtype=np.int64)
    level = np.array([cells[c][1] for c in cell], dtype=np.int64)
    offsets = np.array([TOPICS[u][0] for u in names])
    difficulty = offsets[topic_idx] + LEVEL_SLOPE * (level - 3) + ITEM_SIGMA * rng.standard_normal(n_prompts)
    prompts, texts = [], set()
    for i in range(n_prompts):
        for _ in range(50):  # redraw numbers until the text is new (ids stay unique regardless)
            text = write_prompt(names[topic_idx[i]], int(level[i]), rng)
            if text not in texts:
                break
        texts.add(text)
        prompts.append({"id": f"sim-{i:05d}", "prompt": text, "topic": names[topic_idx[i]],
                        "level": int(level[i]), "difficulty": float(difficulty[i])})
    st, ids, n, s, p, ability = _trajectory(topic_idx, difficulty, TOPICS, steps, batch_size, rollouts, rng,
                                            shifts)
    return Simulation(prompts, st, ids, n, s, p, names, ability,
                      params={"kind": "templates", "prompts": n_prompts, "steps": steps,
                              "batch_size": batch_size, "rollouts": rollouts, "seed": seed,
                              "shifts": [[sh.step, sh.topic, sh.delta] for sh in shifts]})


def simulate_math(rows: list[dict], epochs: int = 3, batch_size: int = 256, rollouts: int = 8, seed: int = 0,
                  steps: int | None = None, id_field: str = "unique_id", shifts=()) -> Simulation:
    """A trajectory over MATH problems: difficulty follows each row's real ``subject`` and ``level``.

    ``rows`` are MATH training rows (``id_field``, "problem", "subject", "level"; level may be None).
    ``steps`` defaults to ``epochs`` full passes: epochs * floor(N / B).
    """
    if not rows:
        raise DataError("no MATH rows to simulate from")
    names = list(MATH_SUBJECTS)
    topic_idx, level, prompts = [], [], []
    for j, row in enumerate(rows):
        subj = row.get("subject")
        if subj not in MATH_SUBJECTS:
            raise DataError(f"MATH row {j + 1}: unknown subject {subj!r}; expected one of {', '.join(names)}")
        lvl = row.get("level")
        if lvl is not None and lvl not in LEVELS:
            raise DataError(f"MATH row {j + 1}: level must be 1..5 or null, got {lvl!r}")
        if id_field not in row or "problem" not in row:
            raise DataError(f"MATH row {j + 1}: needs {id_field!r} and 'problem' fields")
        topic_idx.append(names.index(subj))
        level.append(UNKNOWN_LEVEL if lvl is None else int(lvl))
        prompts.append({"id": str(row[id_field]), "prompt": row["problem"], "topic": subj, "level": lvl})
    n_prompts = len(rows)
    if not isinstance(epochs, (int, np.integer)) or epochs < 1:
        raise InvalidArgumentError(f"epochs must be a positive integer, got {epochs!r}")
    if steps is None:
        steps = epochs * (n_prompts // batch_size) if batch_size <= n_prompts else 0
    _check_sizes(n_prompts, steps, batch_size, rollouts)
    rng = np.random.default_rng(seed)
    topic_idx = np.array(topic_idx, dtype=np.int64)
    level = np.array(level, dtype=np.int64)
    offsets = np.array([MATH_SUBJECTS[u][0] for u in names])
    difficulty = offsets[topic_idx] + LEVEL_SLOPE * (level - 3) + ITEM_SIGMA * rng.standard_normal(n_prompts)
    for pr, d in zip(prompts, difficulty):
        pr["difficulty"] = float(d)
    st, ids, n, s, p, ability = _trajectory(topic_idx, difficulty, MATH_SUBJECTS, steps, batch_size, rollouts, rng,
                                            shifts)
    return Simulation(prompts, st, ids, n, s, p, names, ability,
                      params={"kind": "math", "prompts": n_prompts, "steps": steps, "batch_size": batch_size,
                              "rollouts": rollouts, "seed": seed, "epochs": epochs,
                              "shifts": [[sh.step, sh.topic, sh.delta] for sh in shifts]})
