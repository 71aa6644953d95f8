"""Shared test fixtures: a small hand-written prompt set, and the real data folder (skipped when absent)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

SHARED_DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"

# 40 prompts: 4 topics x 10, difficulty level 1 (easy) to 3 (hard). Ids are strings on purpose
# ("a01", ...) so that id handling never leans on row numbers.
_PROMPTS = {
    "arithmetic": [
        (1, "What is 7 + 5?"),
        (1, "Compute 12 minus 4."),
        (1, "What is 6 times 3?"),
        (2, "Compute 348 multiplied by 27."),
        (2, "What is the remainder when 1001 is divided by 13?"),
        (2, "Find the sum of all integers from 1 to 200."),
        (3, "Find the last three digits of 7 raised to the power 2024."),
        (3, "How many positive divisors does 10! have?"),
        (3, "Find the smallest positive integer n such that n! is divisible by 2^50."),
        (3, "Compute the sum of the digits of 2^100 written in base 10."),
    ],
    "geometry": [
        (1, "A square has side length 4. What is its area?"),
        (1, "What is the perimeter of a rectangle with sides 3 and 5?"),
        (1, "How many degrees are in the angles of a triangle in total?"),
        (2, "A right triangle has legs 9 and 12. Find the length of its hypotenuse."),
        (2, "Find the area of a circle whose circumference is 10 pi."),
        (2, "A regular hexagon has side 2. What is its area?"),
        (3, "A circle is inscribed in a triangle with sides 13, 14 and 15. Find the radius of the circle."),
        (3, "In a tetrahedron with all edges of length 6, find the distance between two opposite edges."),
        (3, "Points A, B, C lie on a circle of radius 5 with AB = 6 and BC = 8. Find the largest possible AC."),
        (3, "Find the volume of the solid obtained by rotating the region under y = sqrt(x) from 0 to 4 about the x-axis."),
    ],
    "probability": [
        (1, "A fair coin is flipped once. What is the probability of heads?"),
        (1, "A fair die is rolled. What is the probability of rolling a 6?"),
        (1, "How many ways can you arrange the letters A, B and C?"),
        (2, "Two fair dice are rolled. What is the probability that the sum is 7?"),
        (2, "How many ways can a committee of 3 be chosen from 10 people?"),
        (2, "A bag has 4 red and 6 blue balls. Two are drawn without replacement. Find the probability both are red."),
        (3, "A fair coin is flipped 10 times. What is the probability of never getting two heads in a row?"),
        (3, "How many permutations of 1 through 8 have no fixed points?"),
        (3, "A random walk starts at 0 and moves +1 or -1 with equal probability. Find the probability it reaches 3 before -2."),
        (3, "Five people each pick a random seat among five. Find the expected number of people in their own seat."),
    ],
    "history": [
        (1, "In which year did World War II end?"),
        (1, "Who was the first president of the United States?"),
        (1, "Which empire built the Colosseum in Rome?"),
        (2, "Which treaty ended the Thirty Years' War in 1648?"),
        (2, "Who was the pharaoh of Egypt during the construction of the Great Pyramid of Giza?"),
        (2, "Which dynasty ruled China when the Forbidden City was completed?"),
        (3, "What were the main causes of the collapse of the Late Bronze Age civilizations around 1177 BC?"),
        (3, "Explain the role of the Investiture Controversy in shaping the medieval relationship of church and state."),
        (3, "How did the Congress of Vienna reshape the balance of power in Europe after Napoleon?"),
        (3, "Compare the fiscal causes of the French Revolution with those of the English Civil War."),
    ],
}

PROMPT_ROWS = [
    {"id": f"{topic[0]}{i:02d}", "prompt": text, "topic": topic, "level": level}
    for topic, items in _PROMPTS.items()
    for i, (level, text) in enumerate(items, start=1)
]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="session", autouse=True)
def _session_embedding_cache(tmp_path_factory):
    """The embedding cache of module-scoped fixtures: a fresh folder of the session, never the user's."""
    os.environ["GRAPHDIFF_CACHE_DIR"] = str(tmp_path_factory.mktemp("embedding-cache"))


@pytest.fixture(autouse=True)
def _embedding_cache(tmp_path_factory, monkeypatch):
    """Each test starts with an empty embedding cache of its own (a count of prompts embedded means what it
    says), in the environment of the test and of the commands it runs."""
    monkeypatch.setenv("GRAPHDIFF_CACHE_DIR", str(tmp_path_factory.mktemp("embedding-cache")))


@pytest.fixture
def prompt_rows() -> list[dict]:
    """The 40 hand-written prompts as dicts {id, prompt, topic, level} (a fresh copy per test)."""
    return [dict(r) for r in PROMPT_ROWS]


@pytest.fixture
def prompts_file(tmp_path, prompt_rows) -> Path:
    """The 40 prompts as a JSONL file with fields id, prompt, topic, level."""
    return write_jsonl(tmp_path / "prompts.jsonl", prompt_rows)


@pytest.fixture
def shared_data() -> Path:
    """../shared/data (the real data sets); the test is skipped where the folder is absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real data folder {SHARED_DATA} is absent (tests that need it are skipped)")
    return SHARED_DATA.resolve()
