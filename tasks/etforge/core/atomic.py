"""Atomic file writes: write a temp file beside the target, fsync, rename."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path


def _default_mode() -> int:
    """0o666 less the umask: what a plain open() would have given (mkstemp gives 0o600)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def _replace_from_temp(target: Path, write) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.chmod(tmp, _default_mode())
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(exc, OSError) and exc.filename in (None, tmp) and exc.errno is not None:
            # Name the file the user knows ("No space left on device: .../summary.json"), not the temp file.
            raise OSError(exc.errno, exc.strerror, str(target)) from exc
        raise


def atomic_write_bytes(target: Path, data: bytes) -> None:
    _replace_from_temp(Path(target), lambda f: f.write(data))


def atomic_write_text(target: Path, text: str) -> None:
    atomic_write_bytes(target, text.encode("utf-8"))


def atomic_copy(source: Path, target: Path) -> None:
    def write(f):
        with open(source, "rb") as src:
            shutil.copyfileobj(src, f, 1 << 20)

    _replace_from_temp(Path(target), write)
