"""Opening a plan's store: local, backed by the shared remote when pipeline.yaml names one.

open_store(plan) -> Store       a run's store (says once what the run's remote cannot do)
reading_store(plan) -> Store    a store for looking facts up (``etforge ci-matrix``): nothing is owed
signing_key(environ)            the shared secret entries are signed with, or why there is none
"""

from __future__ import annotations

import os
import sys

from etforge.cache.store import Store, warn
from etforge.pipeline.layout import layout_of


def signing_key(environ) -> tuple[bytes | None, str | None]:
    """(the shared secret, None), or (None, why there is none) from ETFORGE_CACHE_KEY: a blank
    value is no key (what ``${{ secrets.X }}`` gives a GitHub fork's pull request). The secret is
    the variable's bytes: os.environ holds bytes that are not UTF-8 as surrogate escapes, which
    os.fsencode turns back into those bytes (``str.encode`` would raise UnicodeEncodeError)."""
    value = environ.get("ETFORGE_CACHE_KEY")
    if value is None:
        return None, "ETFORGE_CACHE_KEY is not set"
    if not value.strip():
        return None, "ETFORGE_CACHE_KEY is set but empty"
    return os.fsencode(value), None


def open_store(plan) -> Store:
    """The plan's local store, backed by the shared remote when one is configured.

    Called once per doit invocation, in the main process, before any task runs: so this
    is where the run says, once, that its remote entries are not signed (no usable
    ETFORGE_CACHE_KEY) and that a shared directory does not exist (the run then goes on
    without the remote). Uploads that failed in an earlier run (the remote was down) are
    retried here; when the remote is still down, that is the run's one warning and the
    tasks go on without it.
    """
    layout = layout_of(plan)
    remote = None
    if plan.storage.remote:
        from etforge.cache.remote import remote_from_url

        secret, unsigned = signing_key(os.environ)
        remote = remote_from_url(plan.storage.remote, read_only=plan.storage.read_only, secret=secret)
    store = Store(layout.cache_dir, remote=remote, state_dir=layout.etforge_dir)
    if remote is None:
        return store
    if unsigned:  # say it: a fork's CI gets an empty secret and would otherwise trust anything
        warn(f"remote cache {remote.name()}: {unsigned}: entries are neither signed nor checked in this run")
    store.check_remote()
    if not remote.read_only and store.has_pending():
        uploaded = store.upload_pending()
        if uploaded:
            print(
                f"etforge: remote cache {remote.name()}: uploaded {uploaded} entr{'y' if uploaded == 1 else 'ies'} "
                "an earlier run could not",
                file=sys.stderr,
                flush=True,
            )
    return store


def reading_store(plan) -> Store:
    """The plan's store for looking up facts of entries (``etforge ci-matrix``): its remote read
    only, with no uploads owed and no warnings (unlike ``open_store``, nothing runs)."""
    layout = layout_of(plan)
    remote = None
    if plan.storage.remote:
        from etforge.cache.remote import remote_from_url

        secret, _ = signing_key(os.environ)
        remote = remote_from_url(plan.storage.remote, read_only=True, secret=secret)
    return Store(layout.cache_dir, remote=remote, state_dir=layout.etforge_dir)
