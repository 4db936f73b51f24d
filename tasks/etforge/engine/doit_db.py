"""doit's own database: transactional, and never a reason for a run to fail.

etforge registers :class:`EtforgeDB` as a doit BACKEND plugin (etforge.app.cli): doit's
``sqlite3`` backend, whose commit either lands whole or not at all (SQLite's
rollback journal), so a kill, a full disk or a file-size limit during the write at
the end of a run leaves the previous database intact, and which reads a row it
cannot decode as an empty one instead of dying on it.

Losing the database costs nothing: etforge's tasks decide up-to-dateness from
their own state records (``uptodate`` callables, no ``file_dep``), and doit
keeps only bookkeeping there (saved values, ``doit ignore`` marks). So a
database that doit could not read (a damaged file or row, a foreign schema, a
directory in its place) is moved aside with one warning, before doit opens it
(:func:`prepare`, called by the loader).
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
from pathlib import Path

from doit.dependency import SqliteDB

from etforge.core.errors import BadValue, EtforgeError

BACKEND = "etforge"  # the name EtforgeDB is registered under as a doit BACKEND plugin
FILE_NAME = ".doit.sqlite3"  # a new name: the JSON file of earlier versions is not SQLite
LEGACY_FILE_NAME = ".doit.db"
UNREADABLE = ("SQLITE_CORRUPT", "SQLITE_NOTADB")  # not BUSY/LOCKED: another run may be writing
TABLE_COLUMNS = [("task_id", "text"), ("task_data", "json")]  # doit.dependency.SqliteDB's table


class EtforgeDB(SqliteDB):
    """doit's SQLite backend; a row that does not decode reads as no data (the task's own state
    record, not this database, decides whether it is up to date)."""

    desc = "etforge: doit's SQLite database, damage-tolerant"

    def _get_task_data(self, task_id):
        try:
            data = super()._get_task_data(task_id)
        except (ValueError, sqlite3.DatabaseError):  # a row damaged after prepare() checked it
            return {}
        return data if isinstance(data, dict) else {}


def database_path(artifacts_dir: Path) -> Path:
    return artifacts_dir / FILE_NAME


class DatabaseUnwritable(EtforgeError):
    """doit's database cannot be created (a full disk, a file-size limit): one line naming it."""


def prepare(path: Path) -> str | None:
    """Before doit opens its database: set an unreadable one aside (returns the warning), create a missing one.

    Creating it here, with doit's own backend class, turns a failure into one line
    instead of doit's traceback.
    """
    warning = set_aside_if_unreadable(path)
    if not path.exists():
        from doit.dependency import DatabaseException, JSONCodec

        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            SqliteDB(str(path), JSONCodec()).dump()  # creates the table, commits, closes
        except (DatabaseException, sqlite3.Error, OSError) as exc:
            cause = exc.__context__ if isinstance(exc, DatabaseException) and exc.__context__ else exc
            for leftover in (path, Path(f"{path}-journal")):
                leftover.unlink(missing_ok=True)
            raise DatabaseUnwritable(f"cannot create {path}: {cause}") from None
    return warning


def set_aside_if_unreadable(path: Path) -> str | None:
    """Move an unreadable database (and its journal) aside; return the one-line warning, or None.

    Unreadable: not a regular file (a directory in its place), failing SQLite's check, a
    ``doit`` table of another schema, or any row doit could not decode (doit reads a
    task's row lazily and dies on it with a JSONDecodeError traceback, on every run).
    """
    if not os.path.lexists(path):
        return None
    problem: str | None
    if path.is_dir() or not path.is_file():
        problem = "not a file"
    else:
        try:
            conn = sqlite3.connect(path, timeout=30)
            try:
                problem = _problem(conn)
            finally:
                conn.close()
        except sqlite3.DatabaseError as exc:
            if getattr(exc, "sqlite_errorname", None) not in UNREADABLE:
                return None  # busy, locked, permissions: doit will say so itself
            problem = str(exc)
    if problem is None:
        return None
    aside = path.with_name(path.name + ".corrupt")
    try:
        if aside.is_dir() and not aside.is_symlink():
            shutil.rmtree(aside)
        os.replace(path, aside)
        Path(f"{path}-journal").unlink(missing_ok=True)
    except OSError as exc:
        return f"etforge: warning: doit's database {path} is unreadable ({problem}) and cannot be moved: {exc}"
    return (
        f"etforge: warning: doit's database {path} was unreadable ({problem}); moved it to "
        f"{aside.name} and starting afresh (etforge's state records keep every task up to date)"
    )


def _problem(conn: sqlite3.Connection) -> str | None:
    """Why doit could not use this database, or None."""
    # Reads every page (a truncated file fails here, not halfway through a run);
    # a hot journal left by a killed commit is rolled back first.
    result = conn.execute("PRAGMA quick_check").fetchone()
    if not result or result[0] != "ok":
        return str(result[0] if result else "empty check")
    columns = [(row[1], str(row[2]).lower()) for row in conn.execute("PRAGMA table_info(doit)")]
    if not columns:
        return None  # a new database: doit creates its table
    if columns != TABLE_COLUMNS:
        return f"its doit table has columns {columns}, not {TABLE_COLUMNS}"
    for task_id, data in conn.execute("SELECT task_id, task_data FROM doit"):
        try:
            if not isinstance(json.loads(data), dict):
                raise BadValue("not an object")
        except (TypeError, ValueError) as exc:  # (UnicodeDecodeError is a ValueError)
            return f"the row of {task_id!r} is not a JSON object: {type(exc).__name__}"
    return None


def close(dep_manager, path: Path) -> str | None:
    """Write doit's database; on failure return one line naming the file (the old one stays whole)."""
    try:
        dep_manager.close()
    except (OSError, sqlite3.Error) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        return (
            f"etforge: error: cannot write {path}: {why}; "
            "the previous database is intact and the next run finishes the job"
        )
    return None
