"""``graphdiff extend`` and ``graphdiff retire``: change a STATE's prompt set mid-training, without a rebuild."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..common import command, emit, progress, warn
from ..options import (DEFAULT_LOCK_TIMEOUT, CacheDirOption, IdFieldOption, LockTimeoutOption, NoCacheOption,
                       StateOption)


@command("extend")
def extend(
    state: StateOption,
    prompts: Optional[Path] = typer.Option(None, "--prompts", help="The new prompts: JSONL, CSV or Parquet rows "
                                           "'id, prompt' (ids and texts not yet in the STATE), embedded here."),
    embedded: Optional[Path] = typer.Option(None, "--embedded", help="Instead of --prompts: their embeddings "
                                            "artifact (graphdiff embed, with the STATE's model, instruction and dim)."),
    embeddings: Optional[Path] = typer.Option(None, "--embeddings", help="Where the embeddings the STATE was built "
                                              "from are now, if they moved (checked by content hash)."),
    id_field: IdFieldOption = "id",
    text_field: str = typer.Option("prompt", "--text-field", help="Column holding the prompt text."),
    messages: str = typer.Option("user", "--messages", help="A chat-list prompt ([{role, content}, ...], verl's and "
                                 "TRL's conversational format) becomes: 'user' the user turns' contents, 'all' "
                                 "every turn as 'role: content' (docs/how-to/trainers.md)."),
    batch_size: int = typer.Option(64, "--batch-size", help="Encoder batch size."),
    device: str = typer.Option("auto", "--device", help="auto, cpu, cuda or cuda:N (for the encoder)."),
    cache_dir: CacheDirOption = None,
    no_cache: NoCacheOption = False,
    lock_timeout: LockTimeoutOption = DEFAULT_LOCK_TIMEOUT,
):
    """Add prompts: embedded with the STATE's own encoder (each text once: the embedding cache holds the ones
    embedded before), joined to the graph with its k and mutual rule, given
    a prior state from their neighbours; the next revision of the current step (undo: rollback --to T.R)."""
    from ...state import State

    with progress("extending the prompt set") as bar:
        res = State.open(state).extend(prompts, embedded=embedded, embeddings=embeddings, id_field=id_field, text_field=text_field,
                         messages=messages, batch_size=batch_size, device=device, cache_dir=cache_dir,
                         use_cache=not no_cache, lock_timeout=lock_timeout, progress=bar)
    t = res["timings"]
    for line in res["warnings"]:
        warn(line)
    enc = res.get("encoding")
    embedded = "" if enc is None else (f"{enc['embedded']} embedded, {enc['from_cache']} from the embedding cache; "
                                       if enc["cache_dir"] else f"{enc['embedded']} embedded, no embedding cache; ")
    emit(res, f"step {res['version']}: {res['added']} prompts added ({embedded}{res['n_prompts']} now, {res['edges']} edges; "
              f"{res['changed_lists']} old kNN lists changed, {res['new_isolated']} new prompts without a mutual "
              f"neighbour) in {t['total_s']:.2f} s (embed {t['embed_s']:.2f}, graph {t['graph_s']:.2f}, write "
              f"{t['write_s']:.2f}); undo: {res['undo']}"
              + (f"; covariates: {'; '.join(res['covariate_notes'])}" if res.get("covariate_notes") else ""))


@command("retire")
def retire(
    state: StateOption,
    ids: Path = typer.Option(..., "--ids", help="The prompts: one id per line, or a table with an 'id' column."),
    restore: bool = typer.Option(False, "--restore", help="Put retired prompts back into the candidate set."),
    lock_timeout: LockTimeoutOption = DEFAULT_LOCK_TIMEOUT,
):
    """Take prompts out of the candidate set (predict, select and allocate skip them); what they taught the
    states stays. The next revision of the current step (undo: rollback --to T.R, or --restore)."""
    from ...state import State

    with progress("restoring prompts" if restore else "retiring prompts") as bar:
        res = State.open(state).retire(ids, restore=restore, lock_timeout=lock_timeout, progress=bar)
    for line in res["warnings"]:
        warn(line)
    emit(res, f"step {res['version']}: {res['prompts']} prompts {'restored' if restore else 'retired'} "
              f"({res['n_retired']} retired, {res['active']} active); undo: {res['undo']}")
