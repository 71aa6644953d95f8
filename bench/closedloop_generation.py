"""What the closed loop's generation costs outside the trainer: one held-out evaluation (greedy + sampled) and
one oracle measurement, each read the plain way (every sample's prompt run through the model again) and the
way ``closedloop.policy`` reads it now (a prompt's prefix cache shared by its samples, and by an evaluation's
greedy and sampled completions), with the completions of the two compared.

    python -m closedloop data --out W/data --train-per-cell 250 --test-per-cell 250 --sft-per-cell 600 \\
        --sft-noise-min 0.1 --sft-noise-max 0.7 --skills compare,sort --seed 0
    python -m closedloop sft --data W/data --out W/policy --seed 0 --steps 2000
    python bench/closedloop_generation.py --data W/data --policy W/policy [--threads 1] [--repeats 2]

Prints one JSON object: seconds per call (best of ``--repeats``); whether the evaluation's verdicts (greedy
right or wrong, successes of the samples) are the same both ways; whether the sampled completions' texts are
(the held-out samples, the oracle's).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True)
    p.add_argument("--policy", required=True)
    p.add_argument("--eval-samples", type=int, default=4)
    p.add_argument("--oracle-candidates", type=int, default=128, help="pool_factor 4 x 32 prompts a step")
    p.add_argument("--oracle-samples", type=int, default=32)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=2)
    a = p.parse_args()

    import torch

    from closedloop.policy import generate, heldout, load_policy
    from closedloop.tasks import verify

    torch.set_num_threads(a.threads)
    model, tok = load_policy(a.policy)
    test = [json.loads(line) for line in Path(a.data, "test.jsonl").open()]
    train = [json.loads(line) for line in Path(a.data, "train.jsonl").open()][:a.oracle_candidates]

    def best(fn):
        times, out = [], None
        for _ in range(a.repeats):
            t0 = time.perf_counter()
            out = fn()
            times.append(time.perf_counter() - t0)
        return min(times), out

    def plain(rows, n, greedy, seed):  # the old way: each prompt repeated n times, read n times
        flat = generate(model, tok, [r["prompt"] for r in rows for _ in range(n)], num_samples=1, greedy=greedy,
                        seed=seed)
        return [[c[0] for c in flat[j * n:(j + 1) * n]] for j in range(len(rows))]

    def counts(rows, comps):
        return [sum(verify(c, r["answer"]) for c in cs) for cs, r in zip(comps, rows)]

    n = a.eval_samples
    t_pg, pg = best(lambda: plain(test, 1, True, 0))
    t_ps, ps = best(lambda: plain(test, n, False, 0))
    t_ev, (ok, c) = best(lambda: heldout(model, tok, test, n, seed=0))
    ss = generate(model, tok, [r["prompt"] for r in test], num_samples=n, greedy=False, seed=0)  # heldout's draws
    m = a.oracle_samples
    t_po, po = best(lambda: plain(train, m, False, 5))
    t_so, so = best(lambda: generate(model, tok, [r["prompt"] for r in train], num_samples=m, greedy=False, seed=5))
    print(json.dumps({
        "threads": a.threads, "held_out_prompts": len(test), "eval_samples": n,
        "evaluation_seconds": {"plain": round(t_pg + t_ps, 3), "plain_greedy": round(t_pg, 3),
                               "plain_sampled": round(t_ps, 3), "shared": round(t_ev, 3)},
        "evaluation_same": ok.tolist() == [int(x) for x in counts(test, pg)] and c.tolist() == counts(test, ps),
        "sampled_texts_same": ss == ps,
        "held_out_greedy": float(ok.mean()), "held_out_sampled": float(c.mean() / n),
        "oracle": f"{len(train)} candidates x {m}",
        "oracle_seconds": {"plain": round(t_po, 3), "shared": round(t_so, 3)},
        "oracle_texts_same": po == so,
    }))


if __name__ == "__main__":
    main()
