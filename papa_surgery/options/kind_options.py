"""Which options tune which kind of constants: one set for another kind would do nothing, so it is refused."""

from __future__ import annotations

from ..failures import ArgumentError, spell

# The options that tune how one kind is made (``DistillOptions``' fields): given for another kind they would do nothing.
KIND_OPTIONS = {"distilled": ("distill_steps", "distill_objective", "distill_lr"), "sharpened": ("sharpen_search",)}


def check_kind_options(kind_name: str, given, fitted: bool, why: str = "") -> None:
    """ArgumentError naming the first of ``given`` (option names the user set) that does nothing for constants of
    ``kind_name`` (``fitted``: they are made here, not read from a file of that kind); ``why`` says how the kind was
    chosen when the user did not choose it."""
    for name in given:
        owner = next(k for k, names in KIND_OPTIONS.items() if name in names)
        if owner == kind_name and fitted:
            continue
        if owner == kind_name:
            detail = f"the constants file already holds {owner} constants, so nothing is fitted"
            fix = f"drop {spell(name)}, or pass the average it starts from with {spell('kind', owner)} to fit again"
        else:
            detail = f"tunes {owner} constants, and these are {kind_name}{why}"
            fix = f"add {spell('kind', owner)}, or drop {spell(name)}"
        raise ArgumentError(name, f"{detail}: {fix}")
