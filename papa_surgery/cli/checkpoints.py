"""Commands on a finished checkpoint folder: ``inspect`` (what it holds) and ``push`` (publish it)."""

from __future__ import annotations

import click

from ..options import PushOptions, click_options, from_kwargs
from .context import verbosity


@click.command("inspect")
@click.argument("directory", type=click.Path(exists=True, file_okay=False))
@verbosity
def inspect_(directory):
    """What a PAPA checkpoint holds: heads, kind, ranking, corpus, sizes."""
    from ..conversion.description import format_description
    from ..conversion.inspection import describe

    d = describe(directory)
    click.echo(format_description(d))
    if d["problems"]:  # validated the way loading will: a folder that would not load is a failed inspection
        raise ValueError(f"{directory} would not load: {'; '.join(d['problems'])}")


@click.command()
@click.argument("directory", type=click.Path(exists=True, file_okay=False))
@click_options(PushOptions)
@verbosity
def push(directory, **kwargs):
    """Publish a checkpoint folder to the Hugging Face Hub in one commit.

    Only a folder that holds what papa-surgery wrote is pushed: one with other files (notes, keys, data) is refused,
    naming them, since the whole folder would be public.
    """
    from ..conversion.hub import push as hub_push

    opts = from_kwargs(PushOptions, kwargs)  # without --repo-id: <the token's namespace>/<folder name>
    url = hub_push(directory, opts.repo_id, private=opts.private, revision=opts.revision, create_pr=opts.create_pr)
    click.echo(f"pushed {directory} -> {url}")
