"""How a checkpoint shows its healing: the line ``papa-surgery inspect`` prints and the model card's section.

Both read the recipe's ``healing`` entry (written by :func:`papa_surgery.healing.heal_model`): the teacher, the
corpus, the steps, what trained and the held-out agreement before and after. Torch-free.
"""

from __future__ import annotations

TRAINED = {  # {constants}: ", plus the constants" where they trained too
    "lora": "LoRA adapters (rank {rank}) on the value, attention-output and feed-forward layers{constants}; "
    "merged into the weights",
    "full": "every weight of the transformer layers (not the embeddings){constants}",
    "constants": "the constant matrices only",
}


def _agreement(entry: dict | None) -> str:
    if not entry:
        return "not measured"
    return (
        f"sentence cosine {entry['sentence_cosine']:.4f}, token cosine {entry['token_cosine']:.4f}, "
        f"loss {entry['loss']:.4f}"
    )


def healing_line(record: dict | None) -> str | None:
    """One line for ``inspect`` (``None``: not healed)."""
    if not record:
        return None
    after, before = record.get("heldout_after") or {}, record.get("heldout_before") or {}
    cosines = ""
    if after and before:
        cosines = f"; held-out sentence cosine {before['sentence_cosine']:.4f} -> {after['sentence_cosine']:.4f}"
    frozen = " (constants frozen)" if record.get("freeze_constants") else ""
    on = f" on {record['corpus']}" if record.get("corpus") else ""  # healing's corpus need not be calibration's
    if record.get("training_examples"):  # what it trained on: --max-examples and --heldout take from the corpus
        on += f" ({record['training_examples']:,} of its examples trained on)"
    return f"{record.get('train')}{frozen} for {record.get('steps')} steps toward {record.get('teacher')}{on}{cosines}"


def healing_table(record: dict | None) -> str:
    """The model card's healing table (markdown; empty when the checkpoint was not healed)."""
    if not record:
        return ""
    frozen = bool(record.get("freeze_constants"))  # healed around the constants, which stayed as stored
    trained = TRAINED.get(record.get("train"), str(record.get("train"))).format(
        rank=record.get("lora_rank"), constants="" if frozen else ", plus the constants"
    ) + ("; the constants kept as stored" if frozen else "")
    processes = record.get("processes") or 1
    steps = f"{record.get('steps')} x {record.get('batch_size')} examples" + (
        f" x {processes} processes" if processes > 1 else ""
    )
    constants_lr = "frozen" if frozen else record.get("constants_lr")
    schedule = f"{record.get('schedule')}; peak lr {record.get('lr') or '-'} (constants {constants_lr})"
    rows = [
        ("teacher", f"`{record.get('teacher')}` (the source model)"),
        ("corpus", f"{record.get('corpus')}, {record.get('training_examples')} examples "
                   f"({record.get('heldout_examples')} more held out)"),  # fmt: skip
        ("what trained", f"{trained} ({record.get('trainable_parameters'):,} parameters)"),
        ("objective", str(record.get("objective_description") or record.get("objective"))),
        ("steps", steps),
        ("schedule", schedule),
        ("held-out agreement before", _agreement(record.get("heldout_before"))),
        ("held-out agreement after", _agreement(record.get("heldout_after"))),
    ]  # fmt: skip
    lines = ["| | |", "|---|---|"] + [f"| {name} | {str(value).replace('|', '/')} |" for name, value in rows]
    return "\n".join(lines)
