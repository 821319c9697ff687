"""Publish a PAPA checkpoint folder to the Hugging Face Hub in one commit.

``push`` checks that the folder is a complete PAPA checkpoint before any network call, resolves the
token (argument, ``HF_TOKEN``, or the saved login), creates the repo if needed and uploads the folder
with a single ``create_commit``: all files or none (``upload_folder`` may split a folder into several commits
and retry a failed one "in smaller chunks", which can leave half a checkpoint published). The local folder is only
read: the files are staged in a temporary folder (hard links where possible) where the card's repo-id placeholder
is filled in. Re-running a push is safe: unchanged files make no new commit.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from ..failures import one_line
from .card import REPO_PLACEHOLDER
from .inspection import REQUIRED_FILES, describe, shipped_code_files


def login_hint() -> str:
    """How to give a token, in the words of the front end in use (``token=`` exists in Python only)."""
    from ..failures import on_command_line

    return "run `huggingface-cli login` (or `hf auth login`), or set HF_TOKEN" + (
        "" if on_command_line() else ", or pass token="
    )


def _refuse_offline() -> None:
    """RuntimeError when huggingface_hub is in offline mode: nothing can be pushed."""
    from huggingface_hub import constants

    if constants.is_offline_mode():
        raise RuntimeError("HF_HUB_OFFLINE is set: unset it (or set HF_HUB_OFFLINE=0) to push to the Hub")


IGNORE_PATTERNS = ["__pycache__/*", "**/__pycache__/*", "*.pyc", ".ipynb_checkpoints/*", ".DS_Store", ".cache/*"]
# Entries a checkpoint folder may hold that papa-surgery did not write and a push passes over (not uploaded: git's
# and huggingface_hub's local bookkeeping, caches) or uploads harmlessly (.gitattributes, as the Hub keeps it).
NOT_PUBLISHED = {".git/", ".cache/", "__pycache__/", ".ipynb_checkpoints/", ".DS_Store", ".gitattributes"}


def _operations(staging: Path) -> list:
    """One ``CommitOperationAdd`` per staged file (``IGNORE_PATTERNS`` left out), in a fixed order."""
    from fnmatch import fnmatch

    from huggingface_hub import CommitOperationAdd

    files = sorted(p for p in staging.rglob("*") if p.is_file())
    names = [p.relative_to(staging).as_posix() for p in files]
    return [
        CommitOperationAdd(path_in_repo=name, path_or_fileobj=str(path))
        for name, path in zip(names, files, strict=True)
        if not any(fnmatch(name, pattern) for pattern in IGNORE_PATTERNS)
    ]


def _with_retries(commit, attempts: int = 3, wait: float = 1.0):
    """``commit()``, tried again after a server error (5xx) or a lost connection, waiting 1 s then 2 s. Safe: a commit
    the server made before its answer was lost makes the retry find every file unchanged, and no commit follows."""
    import time

    from huggingface_hub.errors import HfHubHTTPError

    for attempt in range(attempts):
        try:
            return commit()
        except Exception as err:
            status = getattr(getattr(err, "response", None), "status_code", None)
            # the HTTP client's network errors (httpx's or httpx2's, as the huggingface_hub release has it)
            lost = any(c.__name__ == "TransportError" for c in type(err).__mro__)
            server = isinstance(err, HfHubHTTPError) and status is not None and status >= 500
            if attempt + 1 == attempts or not (lost or server):
                raise
            time.sleep(wait * 2**attempt)


def validate_checkpoint(checkpoint_dir) -> dict:
    """``describe`` of a folder that is complete enough to publish; ValueError naming what is missing."""
    folder = Path(checkpoint_dir)
    d = describe(folder)  # ValueError when this is not a PAPA checkpoint at all
    if d["problems"]:
        raise ValueError(f"{folder} would not load: {'; '.join(d['problems'])}; convert it again")
    wanted = list(dict.fromkeys([*REQUIRED_FILES, *shipped_code_files(folder)]))
    missing = [name for name in wanted if not (folder / name).is_file()]
    if missing:
        fix = " (write the model card with papa_surgery.conversion.card.write_card)" if missing == ["README.md"] else ""
        raise ValueError(f"{folder} is not a complete PAPA checkpoint: missing {', '.join(missing)}{fix}")
    from ..outputs.overwrite import foreign_entries

    foreign = [name for name in foreign_entries(folder) if name not in NOT_PUBLISHED and name not in wanted]
    skipped = {name.rstrip("/") for name in NOT_PUBLISHED}
    foreign += sorted(  # hidden files inside the module folders (1_Pooling/.env): never what papa-surgery copies
        rel.as_posix()
        for rel in (p.relative_to(folder) for p in folder.rglob(".*"))
        if len(rel.parts) > 1 and rel.parts[0] not in skipped and rel.name != ".DS_Store"
    )
    if foreign:  # a push publishes the whole folder: notes, keys, data of the user's would go public
        shown = ", ".join(foreign[:8]) + (f" and {len(foreign) - 8} more" if len(foreign) > 8 else "")
        raise ValueError(
            f"{folder} holds files papa-surgery did not write: {shown}; a push uploads the whole folder, so move them "
            "out first (or upload them yourself with huggingface_hub, if they are meant to be public)"
        )
    if d["constant_heads"] and not d["constants"]:  # fraction 0 (no constants at all) is valid
        raise ValueError(f"{folder}/model.safetensors has no *papa_constants tensors although heads are constant")
    return d


def resolve_token(token: str | None = None) -> str:
    """The token to push with: the argument, ``HF_TOKEN``, or the saved login; RuntimeError when none."""
    if token:
        return token
    from huggingface_hub import get_token

    found = os.environ.get("HF_TOKEN") or get_token()
    if not found:
        raise RuntimeError(f"no Hugging Face token found to push with: {login_hint()}")
    return found


def check_repo_id(repo_id: str, argument: str = "repo_id") -> str:
    """The repo id if its syntax is valid (``namespace/name``); an ``ArgumentError`` (bad usage) otherwise."""
    from huggingface_hub.utils import validate_repo_id

    from ..options import ArgumentError

    try:
        validate_repo_id(repo_id)
    except Exception as err:
        raise ArgumentError(argument, f"{repo_id!r} is not a valid Hub repo id: {err}") from None
    if "/" not in repo_id:
        raise ArgumentError(argument, f"repo id {repo_id!r} needs a namespace: pass 'your-name/{repo_id}'")
    return repo_id


def resolve_push_target(
    repo_id: str | None,
    folder_name: str,
    *,
    token: str | None = None,
    endpoint: str | None = None,
) -> str:
    """The repo id a push will use, checked before any work: syntax, token, Hub reachability and namespace.

    Without ``repo_id`` the id is ``<the token's namespace>/<folder_name>``, as ``push_to_hub`` does.

    Raises:
        ArgumentError: an invalid repo id (bad usage).
        RuntimeError: no token, offline mode, a rejected token, an unreachable Hub, or a namespace the
            token cannot write to.
    """
    from huggingface_hub import HfApi

    if repo_id:
        check_repo_id(repo_id)
    _refuse_offline()  # first: with no network a token would not help
    token = resolve_token(token)
    try:
        who = HfApi(endpoint=endpoint, token=token).whoami()
    except Exception as err:
        status = getattr(getattr(err, "response", None), "status_code", None)
        if status == 401:
            raise RuntimeError(f"the Hub rejected the token (401): {login_hint()}") from None
        first = one_line(err)
        raise RuntimeError(
            f"could not reach the Hugging Face Hub to check the push target ({first}); connect, or drop --push "
            "and run `papa-surgery push DIR` later"
        ) from None
    user = who.get("name")
    namespaces = {user, *(org.get("name") for org in who.get("orgs") or [])}
    if not repo_id:
        repo_id = check_repo_id(f"{user}/{folder_name}", argument="out")
    namespace = repo_id.split("/")[0]
    if namespace not in namespaces:
        raise RuntimeError(
            f"the token belongs to {user!r}, who cannot create repos in {namespace!r} (namespaces: "
            f"{', '.join(sorted(n for n in namespaces if n))}); choose a --repo-id in one of them"
        )
    return repo_id


def _stage(folder: Path, staging: Path, repo_id: str) -> None:
    """Copy (hard-link where possible) the folder into ``staging``; fill the card's repo-id placeholder."""

    def link_or_copy(src, dst):
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)
        return dst

    shutil.copytree(folder, staging, copy_function=link_or_copy, ignore=shutil.ignore_patterns("__pycache__", ".git"))
    readme = staging / "README.md"
    text = readme.read_text(encoding="utf-8")
    readme.unlink()  # never write through a hard link into the user's folder
    readme.write_text(text.replace(REPO_PLACEHOLDER, repo_id), encoding="utf-8")


def _explain(err: Exception, repo_id: str, folder: Path, step: str) -> Exception:
    """A RuntimeError with the cause and the fix; argument errors (plain ValueError) pass through unchanged."""
    from huggingface_hub.errors import HfHubHTTPError

    if isinstance(err, ValueError) and not isinstance(err, HfHubHTTPError):
        return err
    status = getattr(getattr(err, "response", None), "status_code", None)
    if status == 401:
        cause = f"the token was rejected (401); {login_hint()} with a token that has write access"
    elif status == 403:
        cause = (
            f"no write access to {repo_id!r} (403): the name belongs to another user or organisation, "
            "or your token is read-only; choose a repo id in your own namespace"
        )
    elif status == 409:
        cause = f"name clash on {repo_id!r} (409): a repo of another type or a conflicting operation holds it"
    elif status == 412:
        cause = "the branch moved during the push (412)"
    else:
        cause = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
    return RuntimeError(
        f"push to {repo_id} failed while {step}: {cause}. The local folder {folder} is unchanged; "
        "re-run the push to retry."
    )


def push(
    checkpoint_dir,
    repo_id: str | None = None,
    *,
    private: bool = False,
    token: str | None = None,
    endpoint: str | None = None,
    revision: str | None = None,
    create_pr: bool = False,
    commit_message: str | None = None,
):
    """Upload a PAPA checkpoint folder to the Hub as one commit.

    Args:
        checkpoint_dir: a complete PAPA checkpoint folder (config.json with papa_* fields, model.safetensors,
            the hub code files, papa_recipe.json, README.md).
        repo_id: ``namespace/name`` of the model repo (created when missing, reused when it is yours); default
            ``<the token's namespace>/<folder name>``.
        private: create the repo private (an existing repo keeps its visibility).
        token: Hub token; defaults to ``HF_TOKEN`` or the saved login.
        endpoint: Hub endpoint (defaults to ``HF_ENDPOINT`` / huggingface.co).
        revision: branch to commit to (created from ``main`` when missing); ``None`` is ``main``.
        create_pr: open a pull request instead of committing to the branch.
        commit_message: defaults to a summary of the conversion.

    Returns:
        the ``huggingface_hub.CommitInfo`` of the commit: a ``str`` (the commit URL) with ``.oid`` and
        ``.pr_url``.

    Raises:
        ValueError: the folder is not a complete PAPA checkpoint, or bad arguments (nothing was sent).
        RuntimeError: no token, offline mode, no write access / name clash, or a failed upload.
    """
    from huggingface_hub import HfApi, constants

    folder = Path(checkpoint_dir)
    d = validate_checkpoint(folder)
    if repo_id:
        check_repo_id(repo_id)
    if create_pr and revision not in (None, constants.DEFAULT_REVISION):
        raise ValueError("create_pr opens a pull request against main; do not pass a revision with it")
    _refuse_offline()  # first: with no network a token would not help
    token = resolve_token(token)
    if not repo_id:
        repo_id = resolve_push_target(None, folder.resolve().name, token=token, endpoint=endpoint)

    api = HfApi(endpoint=endpoint, token=token)
    try:
        api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
    except Exception as err:  # HTTP errors and connection failures
        raise _explain(err, repo_id, folder, "creating the repo") from err
    if revision not in (None, constants.DEFAULT_REVISION) and not create_pr:
        try:
            api.create_branch(repo_id, branch=revision, exist_ok=True, repo_type="model")
        except Exception as err:
            raise _explain(err, repo_id, folder, f"creating branch {revision!r}") from err

    if commit_message is None:
        fraction = d["fraction"]
        share = "" if fraction is None else f" ({d['num_constant_heads']}/{d['num_heads_total']} heads constant)"
        commit_message = f"Upload PAPA checkpoint of {d['source_model'] or d['family']}{share} with papa-surgery"
    with tempfile.TemporaryDirectory(prefix="papa-push-") as tmp:
        staging = Path(tmp) / "checkpoint"
        _stage(folder, staging, repo_id)
        commit = dict(repo_type="model", revision=revision, create_pr=create_pr, commit_message=commit_message)
        try:
            # a pull request is opened by the commit itself: a retry after a lost answer could open a second one
            attempts = 1 if create_pr else 3
            return _with_retries(lambda: api.create_commit(repo_id, _operations(staging), **commit), attempts)
        except Exception as err:  # HTTP errors and connection failures: nothing local changed
            raise _explain(err, repo_id, folder, "uploading") from err
