"""OpenRLHF 0.11's prompt path for tests/test_openrlhf_prompts.py: its real source when found, else a reduced
copy of it.

``openrlhf_classes()`` returns (SamplesGenerator, PromptDataset, where): from the real files
``openrlhf/trainer/ppo_utils/samples_generator.py`` and ``openrlhf/datasets/prompts_dataset.py`` when
``GRAPHDIFF_OPENRLHF_SRC`` names an ``openrlhf`` folder (e.g. the 0.11.2 wheel unpacked:
``pip download openrlhf==0.11.2 --no-deps``) or ``openrlhf`` is importable - loaded with ``ray``, ``vllm`` and
OpenRLHF's Experience / engine-call / logger modules replaced by the small stand-ins below, since vLLM and a
GPU do not install here - else from the copies below: OpenRLHF 0.11.2's ``_collect_prompt_batch``,
``SamplesGenerator.generate_samples`` and ``_generate_vllm`` (Apache-2.0) reduced to the prompt flow (no
vLLM, no sleep mode, no images, Experience built as a namespace).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import random
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import torch


class Ref:
    """A Ray object ref that is already resolved (the fake engine runs the request when it is made)."""

    def __init__(self, value):
        self.value = value


def _ray_module(rng: random.Random):
    ray = types.ModuleType("ray")

    def wait(refs, num_returns=1, timeout=None):  # any finished request may come back first
        refs = list(refs)
        i = rng.randrange(len(refs))
        return [refs[i]], refs[:i] + refs[i + 1:]

    ray.wait = wait
    ray.get = lambda x: [r.value for r in x] if isinstance(x, list) else x.value
    return ray


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def openrlhf_source() -> Path | None:
    env = os.environ.get("GRAPHDIFF_OPENRLHF_SRC")
    if env:
        return Path(env)
    spec = importlib.util.find_spec("openrlhf")
    return Path(spec.origin).parent if spec and spec.origin else None


def openrlhf_classes(monkeypatch, rng: random.Random):
    src = openrlhf_source()
    if src is None:
        ray = _ray_module(rng)
        return _generator_copy(ray), PromptDatasetCopy, "a reduced copy of OpenRLHF 0.11.2's source"
    stubs = {"ray": _ray_module(rng), "vllm": types.ModuleType("vllm"),
             "openrlhf.trainer.ppo_utils.experience": types.ModuleType("experience"),
             "openrlhf.trainer.ray.vllm_engine": types.ModuleType("vllm_engine"),
             "openrlhf.utils.logging_utils": types.ModuleType("logging_utils")}
    stubs["vllm"].SamplingParams = lambda **kw: SimpleNamespace(**kw)
    stubs["openrlhf.trainer.ppo_utils.experience"].Experience = lambda **kw: SimpleNamespace(**kw)
    stubs["openrlhf.trainer.ray.vllm_engine"].batch_vllm_engine_call = lambda *a, **k: None
    stubs["openrlhf.utils.logging_utils"].init_logger = logging.getLogger
    for name, module in stubs.items():
        monkeypatch.setitem(sys.modules, name, module)
    gen = _load(src / "trainer" / "ppo_utils" / "samples_generator.py", "_orl_samples_generator")
    data = _load(src / "datasets" / "prompts_dataset.py", "_orl_prompts_dataset")
    return gen.SamplesGenerator, data.PromptDataset, f"OpenRLHF's real source at {src}"


class PromptDatasetCopy(torch.utils.data.Dataset):
    """OpenRLHF 0.11.2's PromptDataset for plain-text prompts (no chat template, no images)."""

    def __init__(self, dataset, tokenizer, strategy, input_template=None):
        key, label_key = strategy.args.data.input_key, strategy.args.data.label_key
        self.prompts = [d[key] if not input_template else input_template.format(d[key]) for d in dataset]
        self.labels = ["" if label_key is None else d[label_key] for d in dataset]
        self.images = [None] * len(self.prompts)
        self.datasources = [d.get("datasource", "default") for d in dataset]

    def __len__(self):
        return len(self.prompts)

    def __getitem__(self, idx):
        return self.datasources[idx], self.prompts[idx], self.labels[idx], self.images[idx]

    def collate_fn(self, item_list):
        return tuple(list(x) for x in zip(*item_list))


def _generator_copy(ray):
    def _collect_prompt_batch(dataloader_iter, num_prompts):
        prompts, labels, images, exhausted = [], [], [], False
        while len(prompts) < num_prompts:
            try:
                _, batch_prompts, batch_labels, batch_images = next(dataloader_iter)
                remaining = num_prompts - len(prompts)
                prompts.extend(batch_prompts[:remaining])
                labels.extend(batch_labels[:remaining])
                images.extend(batch_images[:remaining])
            except StopIteration:
                exhausted = True
                break
        return prompts, labels, images, exhausted

    class SamplesGenerator:
        def __init__(self, strategy, prompts_dataloader, eval_dataloader, tokenizer, vllm_engines):
            self.args, self.vllm_engines = strategy.args, vllm_engines
            self.prompts_dataloader = prompts_dataloader

        def generate_samples(self, **generate_kwargs):
            if getattr(self, "_dataloader_iter", None) is None and not getattr(self, "_sample_buffer", None):
                self._dataloader_iter = iter(self.prompts_dataloader)
                self._sample_buffer = []
            chunk_size = self.args.rollout.batch_size * self.args.rollout.n_samples_per_prompt
            prompts_consumed, filter_pass_rate = 0, None
            if len(self._sample_buffer) < chunk_size and self._dataloader_iter is not None:
                experiences, prompts_consumed, dl_exhausted = self._generate_vllm(
                    self._dataloader_iter, self.args.rollout.batch_size, self.args.algo.dynamic_filtering_enable)
                if self.args.algo.dynamic_filtering_enable and prompts_consumed:
                    filter_pass_rate = len(experiences) / prompts_consumed * 100
                self._sample_buffer.extend(experiences)
                if dl_exhausted:
                    self._dataloader_iter = None
            rollout_samples = self._sample_buffer[:chunk_size]
            self._sample_buffer = self._sample_buffer[chunk_size:]
            exhausted = self._dataloader_iter is None and len(self._sample_buffer) == 0
            return rollout_samples, filter_pass_rate, prompts_consumed, exhausted

        def _generate_vllm(self, dataloader_iter, num_prompts, dynamic_filtering):
            prompts_consumed, accepted = 0, []
            prompts, labels, images, exhausted = _collect_prompt_batch(dataloader_iter, num_prompts)
            if not prompts:
                return [], prompts_consumed, True
            pending = self._dispatch(prompts, labels)
            prompts_consumed += len(prompts)
            while pending:
                ready, pending = ray.wait(pending, num_returns=1, timeout=10.0)
                for ref in ready:
                    experiences = [SimpleNamespace(prompts=[r["prompt"]], labels=[r["label"]],
                                                   scores=torch.tensor([r["scores"]])) for r in ray.get(ref)]
                    if dynamic_filtering:
                        scores = [e.scores[0].item() for e in experiences]
                        min_r, max_r = self.args.algo.dynamic_filtering_range
                        if not (min_r < sum(scores) / len(scores) < max_r):
                            experiences = []
                    if experiences:
                        accepted.extend(experiences)
                    elif dynamic_filtering:
                        new_prompts, new_labels, _, exhausted = _collect_prompt_batch(dataloader_iter, 1)
                        prompts_consumed += len(new_prompts)
                        if new_prompts:
                            pending.extend(self._dispatch(new_prompts, new_labels))
            return accepted, prompts_consumed, exhausted

        def _dispatch(self, prompts, labels):
            n = self.args.rollout.n_samples_per_prompt
            return [self.vllm_engines[0].generate_responses.remote(prompt=p, label=lab, num_samples=n)
                    for p, lab in zip(prompts, labels)]

    return SamplesGenerator
