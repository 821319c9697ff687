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
        from ..conversion.inspection import read_config, read_constants

        config = read_config(path)
        by_layer = defaultdict(list)
        for layer, head in config["papa_constant_heads"]:
            by_layer[int(layer)].append(int(head))
        available = {}
        # compact constants come rebuilt, a long L only its first PLOT_SLOTS slots (a figure shows no more)
        for key, tensor in read_constants(path, PLOT_SLOTS).items():
            numbers = [int(p) for p in key.split(".") if p.isdigit()]
            layer = numbers[-1] if numbers else 0
            tensor = tensor.numpy()  # (Hc, L, L), heads sorted
            for i, head in enumerate(sorted(by_layer.get(layer, []))[: tensor.shape[0]]):
                available[(layer, head)] = tensor[i]
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
    if path is None or not path.is_dir():  # only the picked heads' matrices, their first PLOT_SLOTS slots
        available = {h: m.numpy() for h, m in constants.matrices(heads, PLOT_SLOTS).items()}
    return [(f"({layer}, {head})", available[(layer, head)]) for layer, head in heads]
