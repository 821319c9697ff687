"""Running a model from one of its transformer layers up: the layers below are skipped, returning what they
returned before (the per-layer sharpness fit and the ``sensitivity`` ranking measure a layer's change this way, at
the cost of the layers it reaches)."""

from __future__ import annotations

from contextlib import contextmanager


@contextmanager
def skipped(blocks, returned):
    """``blocks`` not run: each returns ``returned`` (the model still runs its embeddings and the blocks above).

    Every skipped block returns the same value, what the last of them returned: the first block run then gets its
    usual input, whatever the blocks pass each other."""
    # an instance attribute over the class's forward; one already there (accelerate's offload hooks put theirs
    # there) is put back after
    saved = [block.__dict__.get("forward") for block in blocks]
    for block in blocks:
        block.forward = lambda *args, **kwargs: returned
    try:
        yield
    finally:
        for block, before in zip(blocks, saved, strict=True):
            if before is None:
                del block.forward
            else:
                block.forward = before


@contextmanager
def recording(block):
    """A list that gets what ``block`` returns on each forward pass inside the ``with``."""
    returned: list = []
    handle = block.register_forward_hook(lambda module, args, output: returned.append(output))
    try:
        yield returned
    finally:
        handle.remove()


def returned_by(model, blocks, inputs: list[dict], k: int, skip: int = -1, below=None) -> list:
    """What block ``k`` returns on each of ``inputs`` (a forward's keyword arguments each), the blocks up to ``skip``
    not run (returning ``below[b]`` on input ``b``; ``skip`` -1: every block runs)."""
    with recording(blocks[k]) as returned:
        for b, kwargs in enumerate(inputs):
            with skipped(blocks[: skip + 1], below[b] if below else None):
                model(**kwargs)
    return returned
