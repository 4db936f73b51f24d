"""A shared-directory remote (etforge.cache.remote), read and written without leaving its root.

Below the root (the user's own setting, which may itself be a link), every path is
opened one component at a time, relative to its parent's fd, with O_NOFOLLOW; a file
is lstat'ed before it is opened (no FIFO or device is even opened), opened with
O_NONBLOCK and checked again with fstat. So no link planted in the share, whatever it
points to, is read or written through, and no reader blocks. Writes go the same way:
into real directories only (a link where ``tmp/`` or ``<k[:2]>/`` belongs is removed,
never followed), and entries are renamed into place between directory fds.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import uuid
from pathlib import Path

from etforge.core.errors import EtforgeError

_CHUNK = 1 << 20
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafePath(EtforgeError):
    """A path of an entry that is a link or not what etforge writes there (also: too large)."""


def _describe(mode: int) -> str:
    for test, what in (
        (stat.S_ISLNK, "a symlink"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a device"),
        (stat.S_ISBLK, "a device"),
    ):
        if test(mode):
            return what
    return "a regular file" if stat.S_ISREG(mode) else "a special file"


def _lstat(name: str, dir_fd: int) -> os.stat_result:
    return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)


def open_dir(name: str, dir_fd: int) -> int:
    """An fd of the directory ``name`` (in ``dir_fd``), never through a link. FileNotFoundError
    when absent, UnsafePath when it is something else."""
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        raise UnsafePath(f"{name} is {_describe(_lstat(name, dir_fd).st_mode)}, not a directory") from None


def _open_file(name: str, dir_fd: int) -> tuple[int, os.stat_result]:
    """An fd and fstat of the regular file ``name``: lstat first, so that no special file is even
    opened; O_NOFOLLOW|O_NONBLOCK and fstat for one swapped in meanwhile."""
    st = _lstat(name, dir_fd)
    if not stat.S_ISREG(st.st_mode):
        raise UnsafePath(f"{name} is {_describe(st.st_mode)}")
    try:
        fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafePath(f"{name} is a symlink") from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise UnsafePath(f"{name} is {_describe(st.st_mode)}")
    return fd, st


class DirEntry:
    """One entry of a shared directory, opened one component at a time below the root."""

    def __init__(self, root: str, key: str):
        self.fd = None  # None: the entry does not exist
        parent = _open_root(root)
        for part in (key[:2], key):
            try:
                child = open_dir(part, parent)
            except FileNotFoundError:
                return
            finally:
                os.close(parent)
            parent = child
        self.fd = parent

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def read(self, name: str, limit: int) -> bytes | None:
        """The bytes of ``name``, at most ``limit`` of them (UnsafePath when larger); None when absent."""
        if self.fd is None:
            return None
        try:
            fd, st = _open_file(name, self.fd)
        except FileNotFoundError:
            return None
        with os.fdopen(fd, "rb") as f:
            data = f.read(limit + 1) if st.st_size <= limit else b""
        if st.st_size > limit or len(data) > limit:  # (it may grow after the fstat)
            raise UnsafePath(f"{name} is larger than {limit} bytes")
        return data

    def size(self, name: str) -> int | None:
        if self.fd is None:
            return None
        try:
            st = _lstat(name, self.fd)
        except FileNotFoundError:
            return None
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePath(f"{name} is {_describe(st.st_mode)}")
        return st.st_size

    def get(self, name: str, size: int, target: Path) -> None:
        """Copy blob ``name`` to the new file ``target``, only when it has ``size`` bytes, and never more."""
        if self.fd is None:
            raise FileNotFoundError(name)
        fd, st = _open_file(name, self.fd)
        with os.fdopen(fd, "rb") as src:
            if st.st_size != size:
                raise UnsafePath(f"{name} has {st.st_size} bytes, its manifest says {size}")
            with open(target, "xb") as out:
                left = size
                while left and (chunk := src.read(min(_CHUNK, left))):
                    out.write(chunk)
                    left -= len(chunk)


def _open_root(root: str) -> int:
    return os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)  # the user's setting: may be a link


@contextlib.contextmanager
def dir_fds(root: str, *names: str):
    """(root fd, fd of each directory ``names`` in it): each made when missing and replaced when a
    link or file sits where it belongs, so etforge writes only into real directories of its own."""
    fds = [_open_root(root)]
    try:
        for name in names:
            fds.append(_real_dir(name, fds[0]))
        yield tuple(fds)
    finally:
        for fd in fds:
            os.close(fd)


def _real_dir(name: str, dir_fd: int) -> int:
    try:
        return open_dir(name, dir_fd)
    except FileNotFoundError:
        pass
    except UnsafePath:
        os.unlink(name, dir_fd=dir_fd)  # the link or file itself, never what it points to
    try:
        os.mkdir(name, dir_fd=dir_fd)
    except FileExistsError:
        pass  # another writer made it meanwhile
    return open_dir(name, dir_fd)


def set_aside(name: str, dir_fd: int, tmp_fd: int) -> None:
    """Remove entry ``name`` from the directory ``dir_fd``: a link or file at once, a directory by a
    rename into tmp first, so that a half-deleted entry is never mistaken for a whole one."""
    try:
        st = _lstat(name, dir_fd)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=dir_fd)
        return
    trash = f"discard-{name}-{uuid.uuid4().hex[:12]}"
    try:
        os.rename(name, trash, src_dir_fd=dir_fd, dst_dir_fd=tmp_fd)
    except OSError:
        return
    shutil.rmtree(trash, ignore_errors=True, dir_fd=tmp_fd)  # unlinks links, never follows them


def discard_dir(root: str, key: str) -> None:
    """Set entry ``key`` aside; a link or file where its ``<k[:2]>`` directory belongs goes too."""
    with dir_fds(root, "tmp") as (root_fd, tmp):
        try:
            shard = open_dir(key[:2], root_fd)
        except FileNotFoundError:
            return
        except UnsafePath:
            os.unlink(key[:2], dir_fd=root_fd)  # the link itself, never what it points to
            return
        try:
            set_aside(key, shard, tmp)
        finally:
            os.close(shard)


def copy_into(source: Path, name: str, dir_fd: int) -> None:
    with open(source, "rb") as src:
        write_into(src, name, dir_fd)


def write_into(data, name: str, dir_fd: int) -> None:
    """Create the new file ``name`` in ``dir_fd`` from bytes or a binary file, and fsync it."""
    with os.fdopen(os.open(name, _NEW_FILE_FLAGS, 0o666, dir_fd=dir_fd), "wb") as out:
        if isinstance(data, bytes):
            out.write(data)
        else:
            shutil.copyfileobj(data, out, _CHUNK)
        out.flush()
        os.fsync(out.fileno())
