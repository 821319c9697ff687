"""The analysis folder (``papa-surgery analyze``, :func:`papa_surgery.analyze`): written whole or not at all, and
never over anything but an earlier analysis papa-surgery wrote there (with ``overwrite``)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from ..distributed import is_main_process
from ..options import AnalyzeOptions, RunOptions
from .corpora import open_corpus


def analyze(model, tokenizer, corpus, which: str, out_dir, *, overwrite: bool = False, **options) -> dict:
    """An analysis folder (:func:`papa_surgery.analysis.analyze`), with the ``norm`` ranking it implies.

    ``corpus=None`` reads the default corpus. For ``norms`` the folder also gets ``norm-ranking.json``, the
    ``norm`` method's order made from the analysis's ``norm-average`` constants. ``out_dir`` is a new path or an
    empty folder, or (with ``overwrite``) an earlier analysis folder holding only what it wrote
    (:func:`papa_surgery.outputs.overwrite.check_output_folder`); it appears when the analysis is complete.
    """
    from ..analysis import analyze as run_analysis
    from ..calibration.constants import Constants
    from ..outputs.overwrite import check_output_folder
    from ..outputs.staging import staged_dir

    target = Path(out_dir)
    check_output_folder(target, overwrite, "analysis")
    if corpus is None:
        corpus = open_corpus(None, max_examples=options.get("max_examples"))
    check = lambda path: check_output_folder(path, overwrite, "analysis")  # noqa: E731  (again, before replacing)
    main = is_main_process()  # under torch.distributed rank 0 alone writes
    stage = staged_dir(target, overwrite=overwrite, check=check) if main else contextlib.nullcontext(target)
    with stage as folder:
        summary = run_analysis(model, tokenizer, corpus, which, folder, **options)
        if which == "norms" and main:
            from ..ranking.methods import norm_ranking

            norm_ranking(Constants.load(folder / "norm-average.safetensors")).save(folder / "norm-ranking.json")
            summary["files"].insert(-1, "norm-ranking.json")
            (folder / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def run_analyze(
    model_name: str,
    which: str,
    options: AnalyzeOptions,
    out: str,
    progress: bool = True,
    trust_remote_code: bool = False,
    overwrite: bool = False,
) -> Path:
    """``papa-surgery analyze``: an analysis folder (summary, corpus-average constants, figures, ranking)."""
    from ..arguments import check_max_length
    from ..outputs.overwrite import check_output_folder
    from .jobs import _source, _workflow

    target = Path(out)
    check_output_folder(target, overwrite, "analysis", argument="out")  # before the model loads
    _, config, source, _ = _source(model_name, trust_remote_code)
    if getattr(config, "papa_constant_heads", None):
        raise ValueError(
            f"{model_name} is a PAPA checkpoint: its constant heads have no input-dependent attention to analyse; "
            f"analyze its source model ({getattr(config, 'papa_source_model', None) or 'see papa_recipe.json'})"
        )
    check_max_length(config, options.max_length, model_name)
    corpus = open_corpus(options.corpus, max_examples=options.max_examples)
    run = RunOptions(device=options.device, batch_size=options.batch_size, trust_remote_code=trust_remote_code)
    # The analyses read attention probabilities: load eager (a PAPA checkpoint too), whatever the config says.
    flow = _workflow(model_name, run, source, progress, attn="eager")
    analyze(
        flow.model,
        flow.tokenizer,
        corpus,
        which,
        target,
        overwrite=overwrite,
        max_length=options.max_length,
        batch_size=options.batch_size,
        progress=progress,
        source_name=model_name,
    )
    return target
