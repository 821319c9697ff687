"""The paper's probing classifiers (sec. 3.3) on top of a frozen backbone's hidden states.

Both heads read ``features`` of shape (B, N, Ly, H): for every token the hidden states of all
Ly = num_layers + 1 layers (the embeddings included), as ``output_hidden_states`` returns them.

- :class:`SentenceProbe`: per layer a learned, non-attentive weight per *slot* (docs/design.md section 2:
  the same slot layout the constant matrices use) pools the tokens; the Ly pooled vectors are
  concatenated, then Linear(Ly·H → H) → tanh → dropout → Linear(H → labels).
- :class:`TokenProbe`: each token's Ly vectors are concatenated, then Linear → tanh → Linear.

Padding contributes nothing: the slot weights are multiplied by the real-token mask and token
predictions are made per token, so extra padding never changes a prediction.
"""

from __future__ import annotations

import torch
from torch import nn


class SentenceProbe(nn.Module):
    """Slot-weighted pooling per layer, then a 2-layer MLP over the concatenated layers.

    Args:
        num_layers: Ly, hidden-state layers including the embeddings (``num_hidden_layers + 1``).
        hidden_size: H.
        max_length: the slot count L (the task's max length, or a PAPA model's ``papa_max_length``).
        num_labels: output classes.
        dropout: dropout before the output layer.
    """

    def __init__(self, num_layers: int, hidden_size: int, max_length: int, num_labels: int, dropout: float = 0.1):
        super().__init__()
        self.max_length = max_length
        self.slot_weights = nn.Parameter(torch.full((num_layers, max_length), 1.0 / max_length))  # (Ly, L)
        self.dense = nn.Linear(num_layers * hidden_size, hidden_size)
        self.dropout = nn.Dropout(dropout)
        self.out = nn.Linear(hidden_size, num_labels)

    def pool(self, features: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """(B, N, Ly, H) features and (B, N) slots (-1 = padding) -> (B, Ly, H) pooled vectors."""
        real = (slots >= 0).to(features.dtype)  # (B, N)
        w = self.slot_weights[:, slots.clamp_min(0)] * real  # (Ly, B, N)
        return torch.einsum("lbn,bnlh->blh", w.to(features.dtype), features)  # (B, Ly, H)

    def forward(self, features: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """(B, N, Ly, H), (B, N) -> (B, num_labels) logits."""
        pooled = self.pool(features, slots).flatten(1)  # (B, Ly*H)
        return self.out(self.dropout(torch.tanh(self.dense(pooled))))


class TokenProbe(nn.Module):
    """Per-token 2-layer MLP over the token's concatenated layer vectors.

    Args:
        num_layers: Ly, hidden-state layers including the embeddings.
        hidden_size: H (also the MLP's width).
        num_labels: tag classes.
    """

    def __init__(self, num_layers: int, hidden_size: int, num_labels: int):
        super().__init__()
        self.dense = nn.Linear(num_layers * hidden_size, hidden_size)
        self.out = nn.Linear(hidden_size, num_labels)

    def forward(self, features: torch.Tensor, slots: torch.Tensor | None = None) -> torch.Tensor:
        """(B, N, Ly, H) -> (B, N, num_labels) logits (``slots`` is accepted for a uniform call and unused)."""
        return self.out(torch.tanh(self.dense(features.flatten(2))))  # (B, N, labels)


def build_head(kind: str, num_layers: int, hidden_size: int, max_length: int, num_labels: int) -> nn.Module:
    """The probe for a task kind ("sentence" or "token")."""
    if kind == "sentence":
        return SentenceProbe(num_layers, hidden_size, max_length, num_labels)
    if kind == "token":
        return TokenProbe(num_layers, hidden_size, num_labels)
    raise ValueError(f"no probe head for task kind {kind!r}")
