"""What trains while a converted model heals, and how it is folded back into a plain PAPA model.

- ``constants``: only the constant heads' matrices (the ``distilled`` kind; every other weight bit-identical);
- ``lora``: LoRA adapters (peft) on the Linear layers that remain in every transformer layer (value, attention
  output, feed-forward; never the query/key projections, so no removed head comes back), plus the constants;
  merged into the weights at the end;
- ``full``: every weight of the transformer layers, plus the constants.

With ``freeze_constants`` (lora and full) the constants do not train: the student is a copy of the PAPA model as it
is, its constants kept in their storage (compact at a long L), so no dense (L, L) parameter, gradient or Adam state
is made for them.

The embeddings stay frozen in every mode: the token, position and type embeddings are the source's, so a word the
healing corpus never showed keeps the input the source gives it (trained embeddings drift for the corpus's words
only, and text of another source then meets two vocabularies). The constants train as ``exp(theta)`` with
``theta`` initialised at ``log C``: non-negative, and an Adam step moves a cell in proportion to its size. Each
attention module holds its ``papa_theta`` parameter and a forward pre-hook sets ``papa_constants = exp(theta)``
before it runs (the shipped runtime reads ``papa_constants`` and is not changed; the hooks go with :func:`finish`).
The architecture never changes: :func:`finish` returns the class a checkpoint loads, with
its constants frozen and stored as before, and no peft (a healed checkpoint loads without it).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

from torch import nn

from ..failures import on_command_line
from ..registry import TRAIN_MODES

FLOOR = 1e-8  # exp(theta) never reaches an exact zero; cells below this start at it


@dataclass
class Trainable:
    """A student ready to train: the module to call, its parameter groups, and how to fold it back."""

    model: nn.Module  # what the loop calls (a peft model for ``lora``)
    student: nn.Module  # the PAPA model underneath
    mode: str
    constants: list[nn.Parameter]  # theta of each layer with constant heads
    weights: list[nn.Parameter]  # the other trained parameters (LoRA adapters or layer weights)
    targets: tuple[str, ...] = ()  # the modules LoRA adapts
    hooks: list = field(default_factory=list)  # the pre-hooks that set papa_constants = exp(theta)
    frozen_constants: bool = False  # the constants stayed as the PAPA model stored them (no theta, no rebuild)

    @property
    def parameters(self) -> dict[str, nn.Parameter]:
        """Every trained parameter by name (resume state)."""
        ids = {id(p) for p in (*self.constants, *self.weights)}
        return {n: p for n, p in self.model.named_parameters() if id(p) in ids}

    def count(self) -> int:
        return sum(p.numel() for p in (*self.constants, *self.weights))


def prepare(
    papa, mode: str, lora_rank: int = 16, lora_alpha: float | None = None, freeze_constants: bool = False
) -> Trainable:
    """A trainable copy of the PAPA model ``papa`` (never changed) for ``mode`` (``TRAIN_MODES``); with
    ``freeze_constants`` (lora, full) the constants stay as ``papa`` stores them and do not train."""
    from ..conversion.surgery import rebuild_papa_model

    if mode not in TRAIN_MODES:
        raise ValueError(f"unknown training mode {mode!r}; choose one of {', '.join(TRAIN_MODES)}")
    if freeze_constants:  # a copy, not a rebuild: a rebuild makes every constant head a dense (L, L) matrix
        student = _copy_as_stored(papa)  # (HealOptions refuses it with the constants mode: nothing would train)
    else:
        _check_dense_constants(papa)
        student = rebuild_papa_model(papa, trainable_constants=True, storage="dense", dtype="float32")
    student.eval()  # no dropout: the targets are deterministic and so is the student
    for p in student.parameters():
        p.requires_grad_(False)
    thetas, hooks = ([], []) if freeze_constants else _log_constants(student)
    if mode == "constants":
        return Trainable(student, student, mode, thetas, [], hooks=hooks)
    if mode == "full":
        frozen = {id(p) for p in _embedding_parameters(student)} | {id(t) for t in thetas}
        if freeze_constants:  # constants a checkpoint holds as a parameter (--trainable-constants) stay too
            frozen |= {id(p) for name, p in student.named_parameters() if name.rpartition(".")[2].startswith("papa_")}
        weights = [p for name, p in student.named_parameters() if id(p) not in frozen and _in_layers(name, student)]
        for p in weights:
            p.requires_grad_(True)
        return Trainable(student, student, mode, thetas, weights, hooks=hooks, frozen_constants=freeze_constants)
    targets = lora_targets(student)
    model = _with_lora(student, targets, lora_rank, lora_alpha)
    for theta in thetas:
        theta.requires_grad_(True)  # peft froze every parameter but its adapters
    weights = [p for name, p in model.named_parameters() if "lora_" in name]
    return Trainable(model, student, mode, thetas, weights, targets, hooks, frozen_constants=freeze_constants)


def _copy_as_stored(papa):
    """``papa`` copied with its constants as stored, without the dense matrices cached from compact parts, and
    stamped with this version. Its hooks come along: transformers' output-capturing hooks, which healing's
    hidden-state objective reads, are installed once per model and marked so."""
    import copy

    from .. import __version__

    student = copy.deepcopy(papa)
    for module in student.modules():
        module.__dict__.pop("_papa_rebuilt", None)  # (Hc, L, L) rebuilt once from compact parts: the copy remakes it
    student.config.papa_surgery_version = __version__
    return student


def _check_dense_constants(papa) -> None:
    """ValueError, before anything is allocated, when the constant heads' dense (L, L) matrices, trained as
    parameters with their gradients and Adam state, would not fit this machine's memory (a long L)."""
    from ..calibration import budget
    from ..conversion.surgery import constant_heads_of

    heads = len(constant_heads_of(papa))
    length = int(papa.config.papa_max_length)
    keep = "--freeze-constants or convert's --heal-freeze-constants" if on_command_line() else "freeze_constants=True"
    fix = f"heal a checkpoint converted at a smaller max_length, or keep its constants as stored: {keep}, lora or full"
    budget.check_dense_fits("healing (it trains the constants)", heads, length, budget.CORPUS_PASS, fix)


def finish(trained: Trainable, storage: str = "auto", dtype=None, compact=None):
    """The healed PAPA model: LoRA merged, constants frozen and stored as ``storage`` (``compact``: its compact
    ``(band, rank)``; and ``dtype``), eval mode."""
    from ..conversion.surgery import rebuild_papa_model
    from ..hub_code.modeling_papa import attention_modules

    student = trained.student
    if trained.mode == "lora":
        student = trained.model.merge_and_unload()  # W + B A scaled, in place: plain Linear layers again
    if trained.frozen_constants:  # stored as the PAPA model stored them: nothing to store back
        for p in student.parameters():
            p.requires_grad_(True)  # as a model from_pretrained gives it (what a rebuild returns)
        return student.eval()
    for hook in trained.hooks:
        hook.remove()
    for module in attention_modules(student):
        theta = module._parameters.pop("papa_theta", None)
        if theta is not None:
            module.__dict__.pop("papa_constants", None)
            module.papa_constants = nn.Parameter(theta.detach().exp(), requires_grad=False)
    return rebuild_papa_model(student, trainable_constants=False, storage=storage, dtype=dtype, compact=compact)


def _log_constants(student) -> tuple[list[nn.Parameter], list]:
    """Give every layer with constant heads a trainable ``papa_theta = log C`` and a pre-hook setting
    ``papa_constants = exp(theta)``; the thetas and the hooks."""
    from ..hub_code.modeling_papa import attention_modules

    thetas, hooks = [], []
    for module in attention_modules(student):
        constants = module._parameters.get("papa_constants")
        if constants is None:
            continue
        del module.papa_constants  # a plain attribute from now on, set from theta before every forward
        module.papa_theta = nn.Parameter(constants.detach().float().clamp_min(FLOOR).log())  # (Hc, L, L)
        _set_constants(module, ())
        hooks.append(module.register_forward_pre_hook(_set_constants))
        thetas.append(module.papa_theta)
    return thetas, hooks


def _set_constants(module, args) -> None:
    module.papa_constants = module.papa_theta.exp()  # (Hc, L, L), non-negative by construction


def _embedding_parameters(model) -> list[nn.Parameter]:
    """The parameters of the embedding modules (token, position and type embeddings and their norm)."""
    out = []
    for name, module in model.named_modules():
        if isinstance(module, nn.Embedding) or name.rsplit(".", 1)[-1].startswith("embed"):
            out.extend(module.parameters())
    return out


def _layer_prefixes(model) -> list[str]:
    """The qualified names of the transformer layers (``encoder.layer.3``): each attention module's path cut
    after its first numeric part."""
    from ..hub_code.modeling_papa import attention_modules

    names = {id(m): n for n, m in model.named_modules()}
    prefixes = []
    for module in attention_modules(model):
        parts = names[id(module)].split(".")
        index = next(i for i, part in enumerate(parts) if part.isdigit())
        prefixes.append(".".join(parts[: index + 1]))
    return prefixes


def layer_modules(model) -> list[nn.Module]:
    """The transformer layer holding each attention module (the module whose output is the next hidden state), in
    layer order."""
    return [model.get_submodule(prefix) for prefix in _layer_prefixes(model)]


def _in_layers(name: str, model) -> bool:
    return any(name.startswith(prefix + ".") for prefix in _layer_prefixes(model))


def lora_targets(model) -> tuple[str, ...]:
    """Every ``nn.Linear`` inside the transformer layers but the query/key projections: what LoRA adapts.

    A fused projection that also holds the values (ModernBERT's ``Wqkv``, DeBERTa's ``in_proj``) is adapted: its
    query/key rows are the kept heads' only.
    """
    from ..models.families import get_family

    family = get_family(model)
    skip = set() if family.q == family.v else {family.q, family.k}
    prefixes = _layer_prefixes(model)
    return tuple(
        name
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear)
        and any(name.startswith(p + ".") for p in prefixes)
        and name.rsplit(".", 1)[-1] not in skip
    )


def _with_lora(student, targets: tuple[str, ...], rank: int, alpha: float | None):
    """``student`` wrapped by peft with LoRA adapters on ``targets`` (exact module names)."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as err:  # a dependency of papa-surgery: only a broken install lacks it
        raise ImportError("train='lora' needs peft: pip install 'peft>=0.15' (or train='full')") from err
    config = LoraConfig(
        r=rank,
        lora_alpha=alpha if alpha is not None else rank,
        target_modules=list(targets),
        lora_dropout=0.0,
        bias="none",
    )
    with warnings.catch_warnings():
        # peft asks the model's deprecated ``is_gradient_checkpointing`` (transformers 5.x warns): not the user's doing
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        return get_peft_model(student, config)
