"""Writing outputs safely: staged, all-or-nothing files and folders, and signals that unwind a run cleanly."""

from .signals import Terminated, signals_raise
from .staging import OutputExistsError, staged_dir, staged_file

__all__ = ["OutputExistsError", "Terminated", "signals_raise", "staged_dir", "staged_file"]
