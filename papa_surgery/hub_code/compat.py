"""Every use of transformers' private or undocumented parts, and the transformers releases this code is tested with.

The rest of the shipped code stands on transformers' public API: the auto classes, ``PreTrainedConfig`` /
``PreTrainedModel`` and their documented methods (``from_dict``, ``post_init``, ``_init_weights`` as the documented
override point, ``register_for_auto_class``), the attention interface (``AttentionInterface``,
``AttentionMaskInterface``, ``ALL_ATTENTION_FUNCTIONS``) and each family's classes by name (``families.py``). What a
release may change without notice is here, each part saying what it relies on, so that a new release is checked,
and if need be fixed, in this one file. ``scripts/test-newest.sh`` (part of the every-tier test command) runs the
loading tests on the newest release PyPI serves; the test command runs them on the floor too.

This file ships inside every PAPA checkpoint: it imports only torch and transformers.
"""

from __future__ import annotations

import re
import sys
import warnings

import torch
import transformers

# The transformers releases this code is tested against: [floor, ceiling). Older releases are refused (the code
# uses what they lack); newer ones load with a warning, so a published checkpoint keeps working the day a new
# major release ships. Families that need more than the floor say so in families.py (``min_transformers``).
TRANSFORMERS_FLOOR = (5, 0)
TRANSFORMERS_CEILING = (6, 0)
_warned_untested = False


def release(version: str) -> tuple[int, int]:
    """(major, minor) of a version string (``(0, 0)`` when it has none)."""
    match = re.match(r"(\d+)\.(\d+)", version)
    return tuple(int(x) for x in match.groups()) if match else (0, 0)


def check_transformers_version(version: str | None = None) -> None:
    """Refuse, with the release needed, a transformers older than the floor; warn once about one past the
    tested range (a ``UserWarning``: the checkpoint loads, but nobody has checked its outputs there)."""
    global _warned_untested
    version = version or transformers.__version__
    found = release(version)
    floor, ceiling = ".".join(map(str, TRANSFORMERS_FLOOR)), ".".join(map(str, TRANSFORMERS_CEILING))
    if found < TRANSFORMERS_FLOOR:
        raise ImportError(
            f"this PAPA checkpoint needs transformers>={floor}, but transformers {version} is installed: "
            f'pip install -U "transformers>={floor}"'
        )
    if found >= TRANSFORMERS_CEILING and not _warned_untested:
        _warned_untested = True
        warnings.warn(
            f"this PAPA checkpoint's code was tested with transformers>={floor},<{ceiling}; transformers {version} "
            f"is newer: it should load, but if its outputs look wrong, compare with "
            f'pip install "transformers>={floor},<{ceiling}"',
            UserWarning,
            stacklevel=2,
        )


class AttentionResolutionMixin:
    """Hooks the resolution of ``attn_implementation`` (``PreTrainedModel.get_correct_attn_implementation``, an
    undocumented method every model runs at construction and on ``set_attn_implementation``, 5.0 to 5.24).

    A PAPA model maps what the user asks for (``"sdpa"``) to the name it runs (``"papa_sdpa"``): the class defines
    ``papa_underlying_attention(requested)`` (what to resolve) and ``papa_wrapped_attention(resolved)`` (what to run).
    """

    def get_correct_attn_implementation(self, requested_attention: str | None, is_init_check: bool = False) -> str:
        requested = self.papa_underlying_attention(requested_attention)
        resolved = super().get_correct_attn_implementation(requested, is_init_check)
        return self.papa_wrapped_attention(resolved)


def attention_implementation(config) -> str:
    """The attention implementation a model runs (``config._attn_implementation``, a private attribute)."""
    return config._attn_implementation


def zeros_unless_loaded(tensor: torch.Tensor) -> torch.Tensor:
    """Zero ``tensor`` in ``_init_weights`` unless a checkpoint already filled it (``transformers.initialization``,
    whose functions skip tensors marked loaded; the module is not in transformers' documentation)."""
    from transformers import initialization

    return initialization.zeros_(tensor)


def family_function(attention_class: type, name: str):
    """A module-level function of a family's modeling module, found from one of its classes: the family's own
    ``eager_attention_forward`` or its rotary function (``apply_rotary_pos_emb``). Modeling modules are not API:
    transformers may rename these, which the loading tests on the newest release would show."""
    return getattr(sys.modules[attention_class.__module__], name)


def eager_attention(attention_class: type):
    """The family's own eager attention function (``eager_attention_forward`` of its modeling module)."""
    return family_function(attention_class, "eager_attention_forward")


def relative_position_bias(module, query, key, relative_pos, rel_embeddings, scale_factor: int) -> torch.Tensor:
    """DeBERTa's disentangled position bias for the kept heads, from the parent class's own method
    (``disentangled_attention_bias`` in v2/v3, ``disentangled_att_bias`` in v1; neither is documented)."""
    method = getattr(module, "disentangled_attention_bias", None) or module.disentangled_att_bias
    return method(query, key, relative_pos, rel_embeddings, scale_factor)


def fused_attention_forward(module, hidden_states, position_embeddings=None, attention_mask=None, **kwargs):
    """ModernBERT's attention forward, step by step as the family's own (5.23+), on the kept heads' query/key.

    The family's module attributes it reads (``Wqkv``, ``Wo``, ``out_drop``, ``attention_dropout``,
    ``sliding_window``, ``deterministic_flash_attn``) and the keywords its attention function takes are the
    family's internals: a release that changes them changes this function only. ``module.Wqkv`` is
    :class:`~shrink.PapaFusedQKV` (it gives the kept heads' Q/K and every head's V); ``papa_rotary`` and
    ``papa_eager`` are the family's functions (:func:`family_function`).
    """
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    b, n = hidden_states.shape[:2]
    d = module.papa_heads.head_dim
    query, key, value = (x.view(b, n, -1, d).transpose(1, 2) for x in module.Wqkv(hidden_states))  # (B, H*, N, d)
    if module.papa_heads.kept:
        cos, sin = position_embeddings
        query, key = module.papa_rotary(query, key, cos, sin, unsqueeze_dim=1)
    attention = ALL_ATTENTION_FUNCTIONS.get_interface(attention_implementation(module.config), module.papa_eager)
    out, weights = attention(
        module,
        query,
        key,
        value,
        attention_mask,
        dropout=module.attention_dropout if module.training else 0.0,
        scaling=d**-0.5,
        sliding_window=module.sliding_window,
        deterministic=module.deterministic_flash_attn,
        **kwargs,
    )
    out = out.reshape(b, n, -1).contiguous()  # (B, N, H d)
    return module.out_drop(module.Wo(out)), weights
