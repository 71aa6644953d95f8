"""An OpenRLHF custom reward function that also feeds graphdiff (``--reward.remote_url`` this file).

OpenRLHF calls ``reward_func(queries, prompts, labels)`` once per rollout in every vLLM engine process.
Each prompt's label (``--data.label_key label``) holds JSON: {"id": "<the prompt's graphdiff id>",
"answer": "...", "eval": true on evaluation rows}. Training rollouts are recorded; the call that completes
a training step's wave applies it to the STATE as one step (graphdiff_cli.integrations.openrlhf). Set in the
environment of the Ray job: GRAPHDIFF_STATE, GRAPHDIFF_BATCH_SIZE (= --rollout.batch_size),
GRAPHDIFF_N_SAMPLES (= --rollout.n_samples_per_prompt), and with dynamic filtering GRAPHDIFF_FILTER_RANGE
("lo,hi", = --algo.dynamic_filtering_range); GRAPHDIFF_EPISODE_PROMPTS (the number of training prompts)
closes an episode's short last step. The rollouts are tagged with the run (the Ray job id, or
GRAPHDIFF_RUN_ID when set: set it, new for each run, when the engines do not run as one Ray job), so a resumed
run sets a crashed run's half-recorded wave aside instead of mixing it into its own.
"""

import torch

from graphdiff_cli.integrations.openrlhf import StepRecorder, parse_label

# built when OpenRLHF loads this file (in each engine process; they share the files next to the STATE): a
# wrong setting then stops the engine with its message, where an error inside reward_func would be swallowed
RECORDER = StepRecorder.from_env()


def correctness(query: str, meta: dict) -> float:
    """Replace with your checker: 1.0 when the response ends with the reference answer."""
    answer = str(meta.get("answer", "")).strip()
    return float(bool(answer) and query.rstrip().endswith(answer))


def reward_func(queries, prompts, labels):
    rewards = []
    for query, label in zip(queries, labels):
        pid, meta = parse_label(label)
        reward = correctness(query, meta)
        if not meta.get("eval"):
            RECORDER.record(pid, reward)  # raises (and writes <STATE>.openrlhf/ERROR) on a refusal
        rewards.append(reward)
    r = torch.tensor(rewards, dtype=torch.float32)
    return {"rewards": r, "scores": r, "extra_logs": {"graphdiff_recorded_success": float(r.mean())}}
