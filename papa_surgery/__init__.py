"""papa-surgery: replace a pretrained encoder's attention heads with constant matrices (PAPA)."""

__version__ = "0.1.0"
