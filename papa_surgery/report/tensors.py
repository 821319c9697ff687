"""The constant matrices of a ``Constants`` object, a constants file or a PAPA checkpoint, for heat maps."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

PLOT_SLOTS = 1024  # a checkpoint's matrices are read up to this many slots for figures


def constant_matrices(source, heads=None, max_heads: int = 3) -> list[tuple[str, object]]:
    """``[(title, (L, L) array), ...]`` of chosen constant matrices.

    Args:
        source: constants (``Constants`` or ``StructuredConstants``), a constants ``.safetensors`` file, or a PAPA
            checkpoint folder; matrices are read up to ``PLOT_SLOTS`` slots.
        heads: ``[[layer, head], ...]`` to show; default up to ``max_heads`` spread over the model (a
            checkpoint: over its constant heads).
    """
    from ..calibration.protocol import ConstantsBase

    path = None if isinstance(source, ConstantsBase) else Path(source)
    if path is not None and path.is_dir():
        from ..conversion.inspection import constants_header, read_config

        config = read_config(path)
        by_layer = defaultdict(list)
        for layer, head in config["papa_constant_heads"]:
            by_layer[int(layer)].append(int(head))
        available = {}  # (layer, head) -> (its layer's tensor, its position there)
        for key in constants_header(path):
            numbers = [int(p) for p in key.split(".") if p.isdigit()]
            layer = numbers[-1] if numbers else 0
            for i, head in enumerate(sorted(by_layer.get(layer, []))):
                available[(layer, head)] = (key, i)
    else:
        if path is not None and not path.is_file():
            raise ValueError(f"{path} is neither a constants file nor a PAPA checkpoint folder")
        constants = source if path is None else ConstantsBase.load(path)  # dense or compact, read the same way
        available = {(layer, h): None for layer in range(constants.num_layers) for h in range(constants.num_heads)}
    if not available:
        raise ValueError(f"{source} holds no constant matrices")
    if heads is None:
        keys = sorted(available)
        step = (len(keys) - 1) / (max_heads - 1) if max_heads > 1 and len(keys) > max_heads else 1
        heads = [keys[round(i * step)] for i in range(min(max_heads, len(keys)))]
    heads = [(int(layer), int(head)) for layer, head in heads]
    for head in heads:
        if head not in available:
            raise ValueError(f"head {head} has no constant matrix in {source}")
    # only the picked heads' matrices, their first PLOT_SLOTS slots (compact constants come rebuilt)
    if path is not None and path.is_dir():
        from ..conversion.inspection import read_constants

        wanted = defaultdict(list)
        for head in heads:
            wanted[available[head][0]].append(available[head][1])
        read = read_constants(path, PLOT_SLOTS, wanted)
        matrices = {h: read[available[h][0]][wanted[available[h][0]].index(available[h][1])] for h in heads}
    else:
        matrices = constants.matrices(heads, PLOT_SLOTS)
    return [(f"({layer}, {head})", matrices[(layer, head)].numpy()) for layer, head in heads]
