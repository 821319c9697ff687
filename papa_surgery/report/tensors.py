"""The constant matrices of a ``Constants`` object, a constants file or a PAPA checkpoint, for heat maps."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

PLOT_SLOTS = 1024  # a checkpoint's matrices are read up to this many slots for figures


def constant_matrices(source, heads=None, max_heads: int = 3) -> list[tuple[str, object]]:
    """``[(title, (L, L) array), ...]`` of chosen constant matrices.

    Args:
        source: a ``Constants`` object, a constants ``.safetensors`` file, or a PAPA checkpoint folder.
        heads: ``[[layer, head], ...]`` to show; default up to ``max_heads`` spread over the model (a
            checkpoint: over its constant heads).
    """
    from safetensors import safe_open

    if hasattr(source, "values") and hasattr(source, "max_length"):
        values = source.values.float().numpy()  # (layers, heads, L, L)
        available = {(lay, h): values[lay, h] for lay in range(values.shape[0]) for h in range(values.shape[1])}
    else:
        path = Path(source)
        available = {}
        if path.is_dir():
            from ..conversion.inspection import read_config, read_constants

            config = read_config(path)
            by_layer = defaultdict(list)
            for layer, head in config["papa_constant_heads"]:
                by_layer[int(layer)].append(int(head))
            # compact constants come rebuilt, a long L only its first PLOT_SLOTS slots (a figure shows no more)
            for key, tensor in read_constants(path, PLOT_SLOTS).items():
                numbers = [int(p) for p in key.split(".") if p.isdigit()]
                layer = numbers[-1] if numbers else 0
                tensor = tensor.numpy()  # (Hc, L, L), heads sorted
                for i, head in enumerate(sorted(by_layer.get(layer, []))[: tensor.shape[0]]):
                    available[(layer, head)] = tensor[i]
        elif path.is_file():
            with safe_open(str(path), framework="pt") as f:
                meta = f.metadata() or {}
                if meta.get("format") != "papa-constants":
                    raise ValueError(f"{path} is not a PAPA constants file (write one with papa-surgery calibrate)")
                values = f.get_tensor("values").float().numpy()
            available = {(lay, h): values[lay, h] for lay in range(values.shape[0]) for h in range(values.shape[1])}
        else:
            raise ValueError(f"{path} is neither a constants file nor a PAPA checkpoint folder")
    if not available:
        raise ValueError(f"{source} holds no constant matrices")
    if heads is None:
        keys = sorted(available)
        step = (len(keys) - 1) / (max_heads - 1) if max_heads > 1 and len(keys) > max_heads else 1
        heads = [keys[round(i * step)] for i in range(min(max_heads, len(keys)))]
    picked = []
    for layer, head in heads:
        if (int(layer), int(head)) not in available:
            raise ValueError(f"head ({layer}, {head}) has no constant matrix in {source}")
        picked.append((f"({layer}, {head})", available[(int(layer), int(head))]))
    return picked
