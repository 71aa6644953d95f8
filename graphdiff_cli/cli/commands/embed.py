"""``graphdiff embed``: prompts file -> embeddings artifact (thin wrapper over stages.prepare.embed_prompts)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from ..common import command, debug, emit, progress, warn
from ..options import CacheDirOption, IdFieldOption, NoCacheOption


@command("embed")
def embed(
    prompts: Path = typer.Argument(..., help="Prompts file (.jsonl, .csv or .parquet), one prompt per row."),
    out: Path = typer.Option(..., "--out", "-o", help="Embeddings artifact to write (a .zarr folder). An "
                             "existing one made with the same model, instruction and dim is reused row by row "
                             "(unless --no-cache)."),
    model: str = typer.Option("bundled", "--model", help="'bundled' (all-MiniLM-L6-v2 shipped with graphdiff), a "
                              "local model folder, or a hub name already in the local Hugging Face cache "
                              "(e.g. Qwen/Qwen3-Embedding-0.6B). Never downloads."),
    instruction: Optional[str] = typer.Option(None, "--instruction", help="Replace the paper's difficulty-aware "
                                              "instruction; the encoder sees 'Instruction: TEXT\\nPrompt: <prompt>'."),
    no_instruction: bool = typer.Option(False, "--no-instruction", help="Embed the raw prompt text."),
    dim: Optional[int] = typer.Option(None, "--dim", help="Matryoshka truncation: keep the first D coordinates, "
                                      "then renormalize (default: the model's full size)."),
    batch_size: int = typer.Option(64, "--batch-size", help="Prompts per encoder batch. After the first batches "
                                   "a log says the rate and the time left."),
    device: str = typer.Option("auto", "--device", help="auto (GPU where one works), cpu or cuda."),
    shard: Optional[str] = typer.Option(None, "--shard", help="I/N: embed only rows [I*ceil(M/N), "
                                        "(I+1)*ceil(M/N)) of the M prompts; join with merge-embeddings."),
    id_field: IdFieldOption = "id",
    text_field: str = typer.Option("prompt", "--text-field", help="Column holding the prompt text: text, or a "
                                   "chat list of {role, content} messages (see --messages)."),
    messages: str = typer.Option("user", "--messages", help="A chat-list prompt ([{role, content}, ...], verl's and "
                                 "TRL's conversational format) becomes: 'user' the user turns' contents, 'all' "
                                 "every turn as 'role: content' (docs/how-to/trainers.md)."),
    covariate: List[str] = typer.Option([], "--covariate", help="A numeric field (column or dotted path) to use as "
                                        "a covariate of the estimate; repeatable. A row without it: missing."),
    category: List[str] = typer.Option([], "--category", help="A categorical field (e.g. data_source, a subject): "
                                       "one indicator per value (the 50 most frequent); repeatable."),
    reference_rate: Optional[str] = typer.Option(None, "--reference-rate", help="FIELD[:ATTEMPTS_FIELD]: a "
                                                 "reference model's pass rate in [0, 1] (e.g. extra_info.pass_rate), "
                                                 "optionally with the field of its number of attempts; a prompt "
                                                 "never rolled out starts from it."),
    answer_field: Optional[str] = typer.Option(None, "--answer-field", help="The reference answer's field, whose "
                                               "form (integer, fraction, LaTeX, ...) becomes covariates, e.g. "
                                               "reward_model.ground_truth in a verl parquet (default: none)."),
    no_text_statistics: bool = typer.Option(False, "--no-text-statistics", help="Leave out the prompt's text "
                                            "statistics (lengths, digits, LaTeX), which are covariates by default."),
    cache_dir: CacheDirOption = None,
    no_cache: NoCacheOption = False,
):
    """Embed prompts (Section 3.3): L2-normalized sentence embeddings with the difficulty-aware instruction."""
    from ...stages.prepare import embed_prompts

    with progress("embedding prompts") as update:
        res = embed_prompts(prompts, out, model=model, instruction=instruction,
                            use_instruction=not no_instruction, dim=dim, batch_size=batch_size,
                            device=device, shard=shard, id_field=id_field, text_field=text_field,
                            messages=messages, covariates=covariate, categories=category,
                            reference_rate=reference_rate, answer_field=answer_field,
                            text_statistics=not no_text_statistics, cache_dir=cache_dir,
                            use_cache=not no_cache, progress=update)
    debug(f"cache: {res['cache']}; embedding cache: {res['embedding_cache']}; timings: {res['timings']}")
    for line in res["warnings"]:
        warn(line)
    emit(res, f"{sources_line(res)} -> {res['out']} ({res['shape'][0]} x {res['shape'][1]}, "
              f"{res['timings']['total_s']:.1f} s); " + covariates_line(res["covariates"]))


def sources_line(res: dict) -> str:
    """Where the prompts' vectors came from: "embedded 120 prompts, 880 from the embedding cache" (and the rows
    reused from --out, the duplicate texts embedded once, the rate)."""
    parts = [f"embedded {res['embedded']:,} prompts"
             + (f" ({res['prompts_per_s']:.1f}/s)" if res.get("prompts_per_s") else ""),
             f"{res['from_cache']:,} from the embedding cache" if res["embedding_cache"] else "no embedding cache"]
    if res["cached"]:
        parts.append(f"{res['cached']:,} reused from {res['out']}")
    if res["duplicates"]:
        parts.append(f"{res['duplicates']:,} duplicate texts embedded once")
    return ", ".join(parts)


def covariates_line(cov: dict | None) -> str:
    """The covariates in one line: their columns and what the encoding filled in."""
    if cov is None:
        return "no covariates"
    kinds = {}
    for c in cov["columns"]:
        kinds.setdefault(c["kind"], []).append(c["name"])
    text = len(kinds.pop("text", []))
    parts = ([f"{text} text statistics"] if text else []) + [f"{k} {', '.join(v)}" for k, v in kinds.items()]
    notes = f" ({'; '.join(cov['notes'])})" if cov["notes"] else ""
    return f"covariates: {cov['width']} features from {'; '.join(parts)}{notes}"
