"""One pass over a corpus, shared by calibration, the analyses and distillation: batches (sharded under
``torch.distributed``), the model borrowed in eval mode, and the pass's provenance."""

from __future__ import annotations

import datetime as _dt
import hashlib
from collections.abc import Callable, Iterator

import torch
from tqdm.auto import tqdm

from .. import __version__
from ..distributed import rank as dist_rank
from ..distributed import world_size
from .constants import model_fingerprint
from .corpus import Corpus


def _shard(batches: Iterator[list], rank: int, world: int) -> Iterator[list]:
    for i, batch in enumerate(batches):
        if i % world == rank:
            yield batch


def _batches(examples: Iterator, batch_size: int) -> Iterator[list]:
    batch = []
    for ex in examples:
        batch.append(ex)
        if len(batch) == batch_size:
            yield batch
            batch = []
    if batch:
        yield batch


def process_batches(corpus: Corpus, batch_size: int, desc: str, progress: bool = True, tokens=None):
    """This process's batches of ``corpus``, with a bar: under torch.distributed, every world_size-th of the
    batches a single process would make (same examples, same padding), so each forward equals one process's.

    ``tokens``: the real tokens of every batch (known from a scan of the corpus), which the bar then counts (a long
    document's batch is worth thousands of a short sentence's); without it the bar counts batches. Returns
    ``(batches, world_size)``; the bar shows on rank 0 only.
    """
    rank, world = dist_rank(), world_size()
    mine = _shard(_batches(corpus, batch_size), rank, world)
    disable = not progress or rank != 0
    if tokens is not None:
        counts = [t for i, t in enumerate(tokens) if i % world == rank]
        bar = tqdm(total=sum(counts), desc=desc, unit="tok", unit_scale=True, disable=disable)
        return _counted(mine, counts, bar), world
    total = None
    try:
        total = len(range(rank, -(-len(corpus) // batch_size), world))
    except TypeError:  # a stream of unknown length
        pass
    return tqdm(mine, total=total, desc=desc, unit="batch", disable=disable), world


def _counted(batches: Iterator[list], counts: list[int], bar) -> Iterator[list]:
    """``batches``, moving ``bar`` by each one's tokens once it is done."""
    try:
        for batch, count in zip(batches, counts, strict=False):
            yield batch
            bar.update(count)
    finally:
        bar.close()


def borrow(model, device=None) -> tuple[torch.device, Callable[[], None]]:
    """Put ``model`` in eval mode on ``device`` (default: where it is) for a pass over a corpus.

    Returns ``(device, restore)``: ``restore()`` puts back the model's train/eval mode and device, so
    calibration and the analyses leave the caller's model as they found it.
    """
    param = next(model.parameters(), None)
    home = param.device if param is not None else torch.device("cpu")
    device = torch.device(device) if device is not None else home
    was_training = model.training
    model.to(device).eval()

    def restore() -> None:
        if device != home:
            model.to(home)
        model.train(was_training)

    return device, restore


def pass_metadata(model, corpus: Corpus, examples: int, batch_size: int, processes: int, source_name=None) -> dict:
    """The provenance of one pass over a corpus (calibration or analysis), stored with its constants."""
    meta = {
        "source_model": source_name or getattr(model.config, "_name_or_path", None) or model.config.model_type,
        "model_type": model.config.model_type,
        "fingerprint": model_fingerprint(model),  # compatibility is checked by identity, not by name
        "corpus": corpus.description,
        "examples": examples,
        "batch_size": batch_size,
        "processes": processes,
        "model_dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
        "papa_surgery_version": __version__,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    if corpus.identity:  # which text, beyond its name (Corpus.identity, hashed): two train.txt are not one corpus
        meta["corpus_identity"] = hashlib.sha256(corpus.identity.encode()).hexdigest()[:16]
    return meta
