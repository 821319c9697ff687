"""Outputs that appear whole or not at all, and never over something this run did not create.

Every file or folder papa-surgery writes is assembled in a hidden *staging* sibling of its target
(``.<name>.papa-staging-<pid>-<random>``, holding a small marker with the writer's pid and host) and moved
into place at the end with a rename that fails when the target exists (``renameat2(RENAME_NOREPLACE)`` on
Linux, ``renamex_np(RENAME_EXCL)`` on macOS, else a claim by ``mkdir`` or ``link``). So:

- a folder or file that appears at the target while a run works (another run, the user) is never replaced:
  the run stops with an error naming where its finished result was kept;
- SIGTERM, SIGHUP and SIGINT raise inside :func:`signals_raise`, so the staging copy is removed;
- a run killed outright (SIGKILL, power loss) leaves a staging copy whose writer is gone: the next run on the
  same target removes it (:func:`clean_leftovers`) and says so;
- outputs get the permissions the user's umask gives new files (``mkdtemp`` alone would give 0700/0600).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import json
import logging
import os
import secrets
import shutil
import socket
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from ..failures import spell
from .places import check_not_cwd, empty_folder
from .signals import signals_raise

logger = logging.getLogger("papa_surgery")

STAGING_TAG = ".papa-staging-"
PREVIOUS_TAG = ".papa-previous-"  # an output being replaced, until its replacement is in place
MARKER = ".papa-staging.json"
Check = Callable[[Path], None]  # raises ValueError when an existing target may not be replaced


class OutputExistsError(FileExistsError):
    """The target appeared while this run worked; ``kept`` is where the finished result was put instead."""

    def __init__(self, target: Path, kept: Path | None):
        self.target, self.kept = Path(target), kept
        where = f"the finished result was kept at {kept}" if kept else "nothing was written"
        super().__init__(
            f"{target} appeared while this run was working and was left untouched; {where} "
            f"(move it into place yourself, or choose another output path)"
        )


# ---------------------------------------------------------------------------------------------- permissions
def user_umask() -> int:
    """The process umask (read from /proc where possible, so no thread sees a changed umask)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def apply_umask(path: Path) -> None:
    """Give ``path`` (a folder, recursively, or a file) the permissions a plain ``open``/``mkdir`` would."""
    mask = user_umask()
    path = Path(path)
    if path.is_dir():
        os.chmod(path, 0o777 & ~mask)
        for root, dirs, files in os.walk(path):
            for name in dirs:
                os.chmod(os.path.join(root, name), 0o777 & ~mask)
            for name in files:
                p = os.path.join(root, name)
                if (os.stat(p).st_mode & 0o777) in (0o600, 0o700):  # tempfile-made: widen to the umask's
                    os.chmod(p, 0o666 & ~mask)
    else:
        os.chmod(path, 0o666 & ~mask)


# ---------------------------------------------------------------------------------------------- renames
def _renameat2_noreplace(src: str, dst: str) -> bool:
    """Linux ``renameat2(..., RENAME_NOREPLACE)``; False when unavailable (old libc, unsupported filesystem)."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_noreplace = -100, 1
    return _renamed(fn(at_fdcwd, os.fsencode(src), at_fdcwd, os.fsencode(dst), rename_noreplace), dst)


def _renamex_excl(src: str, dst: str) -> bool:
    """macOS ``renamex_np(..., RENAME_EXCL)``; False when unavailable."""
    if sys.platform != "darwin":
        return False
    import ctypes

    try:
        fn = ctypes.CDLL(None, use_errno=True).renamex_np
    except (OSError, AttributeError):
        return False
    return _renamed(fn(os.fsencode(src), os.fsencode(dst), 0x4), dst)  # 0x4: RENAME_EXCL


def _renamed(result: int, dst: str) -> bool:
    """A rename syscall's result: True when done, False when the call is unsupported here, else OSError."""
    import ctypes

    if result == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), dst)


def rename_noreplace(src: Path, dst: Path) -> None:
    """Move ``src`` to ``dst`` atomically; ``FileExistsError`` (and nothing moved) when ``dst`` exists."""
    src, dst = str(src), str(dst)
    try:
        if _renameat2_noreplace(src, dst) or _renamex_excl(src, dst):
            return
    except OSError as err:
        if err.errno in (errno.EEXIST, errno.ENOTEMPTY):
            raise FileExistsError(errno.EEXIST, "target exists", dst) from None
        raise
    if os.path.isdir(src):
        os.mkdir(dst)  # the claim: FileExistsError when anything is there; an empty folder of ours is replaced
        try:
            os.rename(src, dst)
        except OSError:
            with contextlib.suppress(OSError):
                os.rmdir(dst)
            raise
        return
    try:
        os.link(src, dst)  # FileExistsError when dst exists
    except FileExistsError:
        raise
    except OSError:  # no hard links here (FAT, some network filesystems): claim with O_EXCL, then replace
        os.close(os.open(dst, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        os.replace(src, dst)
        return
    os.unlink(src)


# ---------------------------------------------------------------------------------------------- staging
def _staging_path(target: Path, suffix: str = "") -> Path:
    return target.parent / f".{target.name}{STAGING_TAG}{os.getpid()}-{secrets.token_hex(4)}{suffix}"


def _marker(target: Path) -> str:
    return json.dumps(
        {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "target": target.name,
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        }
    )


def _owner(staging: Path) -> tuple[int | None, str | None]:
    """(pid, host) of the run that made a staging copy, from its marker (or its name)."""
    marker = staging / MARKER if staging.is_dir() else None
    if marker is not None and marker.is_file():
        try:
            data = json.loads(marker.read_text())
            return int(data["pid"]), str(data.get("host"))
        except (ValueError, KeyError, OSError):
            pass
    try:
        return int(staging.name.split(STAGING_TAG, 1)[1].split("-", 1)[0]), None
    except (IndexError, ValueError):
        return None, None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return True
    return True


def leftovers(target: str | Path) -> list[Path]:
    """Staging copies of ``target`` left by earlier runs (any writer, alive or not)."""
    target = Path(target)
    if not target.parent.is_dir():
        return []
    prefix = f".{target.name}{STAGING_TAG}"
    return sorted(p for p in target.parent.iterdir() if p.name.startswith(prefix))


def clean_leftovers(target: str | Path) -> list[Path]:
    """Remove staging copies of ``target`` whose writer has gone (a killed run); warn about each.

    A copy whose writer is still running (another run on the same target), or that another host made,
    is left alone and named in a warning. Returns the removed paths.
    """
    removed = []
    host = socket.gethostname()
    for path in leftovers(target):
        pid, owner_host = _owner(path)
        if pid == os.getpid() and owner_host in (None, host):
            continue
        if pid is not None and owner_host in (None, host) and not _alive(pid):
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
            logger.warning("removed %s, left by an interrupted papa-surgery run (pid %d) on %s", path, pid, target)
            removed.append(path)
        else:
            who = f"pid {pid}" if pid is not None else "an unknown writer"
            logger.warning(
                "%s is being written by another papa-surgery run (%s%s); remove it if no run is writing to %s",
                path,
                who,
                f" on {owner_host}" if owner_host and owner_host != host else "",
                target,
            )
    return removed


def _put_back_orphans(target: Path) -> None:
    """An output a killed run had moved aside to replace it (``.<name>.papa-previous-<pid>-...``, its writer gone):
    back to ``target`` when nothing took its place (the run died before its result moved in), else removed (the
    result it was replaced by is there, as the user asked). Each said in a warning."""
    if not target.parent.is_dir():
        return
    prefix = f".{target.name}{PREVIOUS_TAG}"
    for path in sorted(p for p in target.parent.iterdir() if p.name.startswith(prefix)):
        try:
            pid = int(path.name[len(prefix) :].split("-", 1)[0])
        except ValueError:
            continue
        if pid == os.getpid() or _alive(pid):
            continue
        if not (target.exists() or target.is_symlink()):
            with contextlib.suppress(OSError):
                rename_noreplace(path, target)
                logger.warning("put %s back: an interrupted papa-surgery run (pid %d) had moved it aside", target, pid)
                continue
        shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
        logger.warning("removed %s, the output an interrupted papa-surgery run (pid %d) replaced", path, pid)


def _keep(staging: Path, target: Path, tag: str = "papa") -> Path:
    """Move ``staging`` (a finished copy that may not go to ``target``, or the output it was to replace: ``tag``
    ``papa-previous``) beside ``target`` under a visible name; where it is now (where it was, if it can't move)."""
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    kept = target.with_name(f"{target.name}.{tag}-{stamp}-{secrets.token_hex(2)}")
    try:
        rename_noreplace(staging, kept)
    except OSError:
        kept = staging
    return kept


class ChangedMeanwhile(ValueError):
    """The target changed while the run worked and may no longer be replaced; ``kept`` is where the result went."""

    def __init__(self, message: str, kept: Path):
        self.kept = kept
        super().__init__(message)


def _check_again(staging: Path, target: Path, check: Check) -> None:
    """``check(target)`` before replacing it (it may have changed meanwhile); on a refusal keep the result beside it."""
    try:
        check(target)
    except ValueError as err:
        kept = _keep(staging, target)
        raise ChangedMeanwhile(
            f"{err} ({target} changed while this run worked; the result was kept at {kept})", kept
        ) from None


def _previous_path(target: Path) -> Path:
    """Where an output being replaced waits until its replacement is in place: hidden, and never taken for a killed
    run's staging copy (:func:`leftovers`), so nothing removes it but the run that put it there."""
    return target.parent / f".{target.name}{PREVIOUS_TAG}{os.getpid()}-{secrets.token_hex(4)}"


def _put_back(previous: Path, target: Path) -> None:
    """Return the output that was being replaced to ``target``; where it can't go, keep it beside it, visibly."""
    if not (previous.exists() or previous.is_symlink()):
        return
    try:
        rename_noreplace(previous, target)
    except OSError:  # the target is taken (by what appeared meanwhile), or the rename failed: keep it in sight
        kept = _keep(previous, target, "papa-previous")
        logger.warning("the previous %s was not replaced and was kept at %s", target, kept)


def _commit(staging: Path, target: Path, overwrite: bool, check: Check | None = None, into_empty=False) -> None:
    """Move a finished staging copy to ``target``: replacing it only when ``overwrite`` and ``check(target)``
    allows it (what is there may have changed while the run worked), or an empty folder when ``into_empty``."""
    if overwrite and check is not None and (target.exists() or target.is_symlink()):
        _check_again(staging, target, check)
    if into_empty and empty_folder(target):  # the empty folder the run was given; one that appears meanwhile is kept
        with contextlib.suppress(OSError):  # not empty any more: the no-replace rename below refuses it
            os.rmdir(target)
    previous = None
    try:
        if overwrite and (target.exists() or target.is_symlink()):
            previous = _previous_path(target)  # named first: an interrupt right after the move still puts it back
            os.replace(target, previous)  # ours to replace: the user asked for it
        rename_noreplace(staging, target)
    except FileExistsError:  # the target appeared meanwhile: the result goes beside it, and so does the previous one
        kept = _keep(staging, target)
        if previous is not None:
            _put_back(previous, target)
        raise OutputExistsError(target, kept) from None
    except BaseException:  # an interrupt or a failed rename: the previous output goes back where it was
        if previous is not None:
            _put_back(previous, target)
        raise
    if previous is not None:  # under a staging copy's name first: a delete cut short is a leftover the next run clears
        done = _staging_path(target, ".old")
        os.replace(previous, done)
        shutil.rmtree(done, ignore_errors=True) if done.is_dir() else done.unlink(missing_ok=True)


@contextlib.contextmanager
def staged_dir(target: str | Path, overwrite: bool = False, check: Check | None = None) -> Iterator[Path]:
    """Yield an empty staging folder; on success it becomes ``target``, on any error (or signal) it is removed.

    An empty folder at ``target`` is written into without ``overwrite`` (one that appears meanwhile is not).
    With ``overwrite``, ``check(target)`` runs just before an existing target is replaced and may refuse it with a
    ValueError (``papa_surgery.outputs.overwrite``); the result is then kept beside it, and the error says where.

    Raises:
        ValueError: ``target`` is the working directory or holds it (it would be pulled from under the shell).
        FileExistsError: ``target`` exists and not ``overwrite`` (checked first, and again atomically at the end:
            :class:`OutputExistsError` then names where the finished folder was kept).
    """
    target = Path(target)
    if target.name in ("", ".."):  # `out/..`: staged beside it as `..`, it could never be moved into place
        target = target.resolve()
    if target.is_dir():
        check_not_cwd(target)
    _put_back_orphans(target)  # before anything looks at the target: it may be one a killed run had moved aside
    into_empty = empty_folder(target)
    if (target.exists() or target.is_symlink()) and not overwrite and not into_empty:
        raise FileExistsError(f"{target} already exists; pass {spell('overwrite', True)} to replace it")
    target.parent.mkdir(parents=True, exist_ok=True)
    clean_leftovers(target)
    with signals_raise():
        staging = _staging_path(target)
        staging.mkdir()
        try:
            (staging / MARKER).write_text(_marker(target))
            yield staging
            (staging / MARKER).unlink()
            apply_umask(staging)
            _commit(staging, target, overwrite, check, into_empty)
        except BaseException as err:
            if getattr(err, "kept", None) != staging:  # a result the error says was kept here stays
                shutil.rmtree(staging, ignore_errors=True)
            raise


@contextlib.contextmanager
def staged_file(target: str | Path, overwrite: bool = True, check: Check | None = None) -> Iterator[Path]:
    """Yield a staging file path beside ``target``; on success it becomes ``target`` (see :func:`staged_dir`)."""
    target = Path(target)
    if target.is_dir():
        raise IsADirectoryError(f"{target} is a folder; pass a file path")
    if target.exists() and not overwrite:
        raise FileExistsError(f"{target} already exists; pass {spell('overwrite', True)} to replace it")
    target.parent.mkdir(parents=True, exist_ok=True)
    clean_leftovers(target)
    with signals_raise():
        staging = _staging_path(target, target.suffix)
        try:
            yield staging
            apply_umask(staging)
            if overwrite and check is not None and target.exists():
                _check_again(staging, target, check)
            if overwrite:
                os.replace(staging, target)
            else:
                _commit(staging, target, overwrite=False)
        except BaseException as err:
            if not isinstance(err, OutputExistsError) and getattr(err, "kept", None) != staging:
                staging.unlink(missing_ok=True)  # a result the error says was kept here stays
            raise
