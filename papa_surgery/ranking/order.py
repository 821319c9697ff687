"""Head rankings: which heads to make constant first (paper 3.2 and 5.4).

A ``Ranking`` orders every head of the model globally, across layers, from the first to replace to
the last; ``--fraction f`` takes the first ``round(f * total)`` heads (:func:`head_count`). This module is
a leaf: the object, its file format and the helpers every strategy shares. The strategies and their
dispatch (``methods.py``, ``lambdas.py``) sit above it; the registry (:mod:`papa_surgery.registry`) says what
each method needs. Methods:

- ``lambda`` (paper 3.2): learned mixing weights, smallest lambda first;
- ``reversed-lambda``: largest lambda first (the paper's "Reversed");
- ``variance``: the label-free input-dependence score from calibration, lowest first;
- ``norm``: the smallest mean contribution ||alpha f|| first (Kobayashi et al. 2020);
- ``first-to-last`` / ``last-to-first``: layer order, in-layer head order inside;
- ``random``: a seeded permutation.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..failures import ArgumentError


def head_count(fraction: float, total: int) -> int:
    """How many of ``total`` heads ``fraction`` makes constant: ``fraction * total`` rounded half up."""
    from ..options import FRACTION, ArgumentError

    try:
        fraction = FRACTION.convert(fraction, None, None)
    except Exception as err:
        raise ArgumentError("fraction", getattr(err, "message", str(err))) from None
    return int(math.floor(fraction * total + 0.5))


@dataclass
class Ranking:
    """Every head of a model, in the order they are made constant.

    Attributes:
        method: how the order was made.
        order: ``[[layer, head], ...]``, first to replace first.
        num_layers, num_heads: the model shape the ranking belongs to.
        scores: per-head score aligned with ``order`` (lambda or variance), or ``None``.
        provenance: task, data, seed, steps, source model, library version.
    """

    method: str
    order: list[list[int]]
    num_layers: int
    num_heads: int
    scores: list[float] | None = None
    provenance: dict = field(default_factory=dict)

    def __post_init__(self):
        self.order = [[int(layer), int(head)] for layer, head in self.order]
        expected = {(layer, head) for layer in range(self.num_layers) for head in range(self.num_heads)}
        if {tuple(x) for x in self.order} != expected or len(self.order) != len(expected):
            raise ValueError(
                f"a ranking must list every one of the {len(expected)} heads ({self.num_layers} layers x "
                f"{self.num_heads} heads) exactly once"
            )

    @property
    def total(self) -> int:
        return len(self.order)

    def count(self, fraction: float) -> int:
        """How many heads ``fraction`` makes constant: round half up of ``fraction * total``."""
        return head_count(fraction, self.total)

    def select(self, fraction: float) -> list[list[int]]:
        """The heads made constant at ``fraction``, sorted by (layer, head)."""
        return sorted(self.order[: self.count(fraction)])

    def check_compatible(self, config) -> None:
        """ValueError unless the ranking was made for a model of this shape."""
        from ..models.families import num_heads_layers

        heads, layers = num_heads_layers(config)
        if (layers, heads) != (self.num_layers, self.num_heads):
            raise ValueError(
                f"the ranking is for {self.num_layers} layers x {self.num_heads} heads but the model has "
                f"{layers} x {heads}; rank heads for this model"
            )

    def save(self, path: str | Path, overwrite: bool = True) -> Path:
        """Write the ranking JSON (atomically).

        An existing file is replaced only when it is a ranking papa-surgery wrote (never another file);
        ``overwrite=False`` refuses any existing file.

        Raises:
            ValueError: ``path`` is a folder or another kind of file, or exists and not ``overwrite``.
        """
        from ..outputs.overwrite import check_file
        from ..outputs.staging import staged_file

        path = check_file(path, overwrite, "ranking", argument="path")
        from ..file_formats import FILE_FORMATS

        header = {"format": "papa-ranking", "format_version": FILE_FORMATS["ranking"]}
        text = json.dumps({**header, **asdict(self)}, indent=2) + "\n"
        check = lambda target: check_file(target, overwrite, "ranking", argument="path")  # noqa: E731
        with staged_file(path, overwrite, check=check) as tmp:
            tmp.write_text(text)
        return path

    @classmethod
    def load(cls, path: str | Path) -> Ranking:
        """Read a file written by :meth:`save`.

        Raises:
            FileNotFoundError: no such file.
            ValueError: the file is not a papa-surgery ranking, or not one of a complete model (naming the file,
                the bad field and the fix).
        """
        path = Path(path)
        hint = "make one with papa-surgery rank"
        if path.is_dir():
            raise ArgumentError("ranking", f"{str(path)!r} is a folder; pass the .json file papa-surgery rank wrote")
        if not path.is_file():
            raise FileNotFoundError(f"ranking file {str(path)!r} does not exist ({hint})")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError as err:
            raise ValueError(f"ranking file {str(path)!r} is not UTF-8 text ({err.reason}); {hint}") from None
        except json.JSONDecodeError as err:
            raise ValueError(f"ranking file {str(path)!r} is not JSON: {err}") from None
        if not isinstance(data, dict) or data.pop("format", None) != "papa-ranking":
            raise ValueError(f"{str(path)!r} is not a papa-surgery ranking ({hint})")
        from ..file_formats import check_file_format

        check_file_format("ranking", data.pop("format_version", None), path)
        return cls(**_checked_fields(data, path))


def _checked_fields(data: dict, path: Path) -> dict:
    """The constructor arguments of a ranking file, each checked for its JSON shape."""
    where = f"ranking file {str(path)!r}"
    names = {"method", "order", "num_layers", "num_heads", "scores", "provenance"}
    missing = sorted({"method", "order", "num_layers", "num_heads"} - set(data))
    if missing:
        raise ValueError(f"{where} lacks {', '.join(missing)}; make it again with papa-surgery rank")
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(f"{where} has unknown field(s) {', '.join(unknown)}")
    if not isinstance(data["method"], str):
        raise ValueError(f"{where}: 'method' must be a string, got {data['method']!r}")
    for key in ("num_layers", "num_heads"):
        if not isinstance(data[key], int) or isinstance(data[key], bool) or data[key] < 1:
            raise ValueError(f"{where}: {key!r} must be a positive integer, got {data[key]!r}")
    order = data["order"]
    if not isinstance(order, list) or not all(
        isinstance(x, list) and len(x) == 2 and all(isinstance(v, int) and not isinstance(v, bool) for v in x)
        for x in order
    ):
        raise ValueError(f"{where}: 'order' must be a list of [layer, head] integer pairs")
    scores = data.get("scores")
    if scores is not None and (
        not isinstance(scores, list)
        or len(scores) != len(order)
        or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in scores)
    ):
        raise ValueError(f"{where}: 'scores' must be null or {len(order)} finite numbers, one per head of 'order'")
    if data.get("provenance") is not None and not isinstance(data["provenance"], dict):
        raise ValueError(f"{where}: 'provenance' must be a JSON object")
    try:
        Ranking(**{**data, "provenance": data.get("provenance") or {}})
    except ValueError as err:
        raise ValueError(f"{where}: {err}") from None
    return {**data, "provenance": data.get("provenance") or {}}


def order_by_scores(scores, ascending: bool = True) -> tuple[list[list[int]], list[float]]:
    """Global order of a (layers, heads) score table; ties break by (layer, head)."""
    flat = [
        (float(scores[layer][head]), layer, head) for layer in range(len(scores)) for head in range(len(scores[layer]))
    ]
    flat.sort(key=lambda t: ((t[0] if ascending else -t[0]), t[1], t[2]))
    return [[layer, head] for _, layer, head in flat], [s for s, _, _ in flat]


def reversed_ranking(ranking: Ranking) -> Ranking:
    """``reversed-lambda``: the lambda ranking read from the largest lambda down."""
    scores = None if ranking.scores is None else list(reversed(ranking.scores))
    prov = {**ranking.provenance, "reversed_from": ranking.method}
    return Ranking(
        "reversed-" + ranking.method, list(reversed(ranking.order)), ranking.num_layers, ranking.num_heads, scores, prov
    )
