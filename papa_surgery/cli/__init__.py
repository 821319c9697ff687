"""The command line, ``papa-surgery``: a click group (``main``) whose commands are adapters over the workflow."""

from .group import main

__all__ = ["main"]
