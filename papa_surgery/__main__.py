"""``python -m papa_surgery``: the command line (for launchers that take a module, e.g. ``torchrun -m``)."""

from .cli import main

if __name__ == "__main__":  # pragma: no cover
    main(prog_name="papa-surgery")
