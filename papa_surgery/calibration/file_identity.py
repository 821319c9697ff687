"""Which text a corpus file holds, as its cache key says it (``Corpus.identity``): a hash of its content, the same on
every machine it is copied to, read once per path, size and modification time in a process."""

from __future__ import annotations

import hashlib
from pathlib import Path


def file_identity(path: Path) -> str:
    """A hash of a file's content (the same wherever it is copied; remembered per path, size and modification time,
    so a sweep opening it for every cell reads it once)."""
    stat = path.stat()
    seen = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if seen not in _HASHED:
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        _HASHED[seen] = f"sha256 {digest.hexdigest()[:32]}"
    return _HASHED[seen]


_HASHED: dict[tuple, str] = {}
