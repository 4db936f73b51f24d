"""Which shared-cache URLs etforge can open, checked when the plan is resolved.

The one home of what each remote protocol needs: etforge.cache.remote reads the
same table when it opens the remote. A protocol that neither this table nor fsspec
knows (``nosuchproto://bucket``) is a ``file:line: cache.remote`` error naming the
known ones and the package that provides each, before anything runs; a known one
whose package is not installed is one too (``s3:// needs s3fs: pip install s3fs``).

Planning stays light: the usual protocols are decided from this table and an
``importlib.util.find_spec`` lookup (no import); fsspec's registry is imported only
for a protocol this table does not list.
"""

from __future__ import annotations

import importlib.util
import re

SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
LOCAL = ("file", "local")  # a shared directory: plain os calls, never fsspec
# Protocols etforge documents, whose implementation lives in a separate package: (import name, pip name).
EXTERNAL = {
    "s3": ("s3fs", "s3fs"),
    "s3a": ("s3fs", "s3fs"),
    "gs": ("gcsfs", "gcsfs"),
    "gcs": ("gcsfs", "gcsfs"),
    "abfs": ("adlfs", "adlfs"),
    "az": ("adlfs", "adlfs"),
}
KNOWN = (
    "a directory or file:// (built in), s3:// or s3a:// (s3fs), gs:// or gcs:// (gcsfs), "
    "abfs:// or az:// (adlfs), or another protocol fsspec lists (fsspec.available_protocols())"
)


def protocol_of(url: str) -> str:
    """The URL's protocol, lower case; ``file`` for a plain path."""
    match = SCHEME.match(url.strip())
    return match.group(1).lower() if match else "file"


def remote_problem(url: str) -> str | None:
    """Why the shared cache at ``url`` cannot be opened on this machine, or None."""
    protocol = protocol_of(url)
    if protocol in LOCAL:
        return None
    package = EXTERNAL.get(protocol)
    if package is None:
        if _fsspec_knows(protocol):
            return None
        return f"unknown remote protocol {protocol}:// in {url.strip()!r}; known: {KNOWN}"
    if importlib.util.find_spec(package[0]) is None:  # a lookup, no import
        return f"{protocol}:// needs {package[0]}: pip install {package[1]}"
    return None


def _fsspec_knows(protocol: str) -> bool:
    """Whether fsspec has an implementation registered or known for ``protocol`` (False without fsspec)."""
    try:
        from fsspec.registry import known_implementations, registry
    except ImportError:
        return False
    return protocol in known_implementations or protocol in registry


def check_remote_setting(doc, url: str | None, from_env: bool) -> None:
    """PipelineError (``file:line: cache.remote: ...``) when the resolved remote cannot be opened here.

    ``doc``: the loaded pipeline.yaml (a LoadedYaml); ``from_env``: the URL came from
    $ETFORGE_CACHE_REMOTE, which the error says (the line is then cache.remote's, if any)."""
    if not url:
        return
    problem = remote_problem(url)
    if problem is None:
        return
    error = doc.error(("cache", "remote"), f"$ETFORGE_CACHE_REMOTE: {problem}" if from_env else problem)
    if from_env and ("cache", "remote") not in doc.lines:
        error.line = None  # not this file's mistake: no line to point at
    raise error
