"""Hostile remote cache entries and what a run says about its remote.

A reader never follows a link out of a shared-directory remote, never opens a FIFO or
device, never reads an oversized manifest whole and never trusts a malformed one: such
an entry is a miss, named in one warning per run and set aside when the remote is
writable, and the run finishes. A run also says once when its entries are not signed
(no usable ETFORGE_CACHE_KEY) and when a shared directory does not exist (not used,
never created).

Importable for randomized fault tests: ``HOSTILE_REMOTE_DAMAGES``, name -> damage(remote_root,
key), each leaving entry ``key`` of the shared directory ``remote_root`` unusable in one hostile
way. What a damage points to outside the remote lives in ``outside_dir(remote_root)`` (its files
hold OUTSIDE_BYTES), so a test can check that nothing there was read (``holds_outside_bytes``)
or written (``snapshot``). A damage expects entry ``key`` whole (one damage per key;
"symlinked shard dir" takes the other entries of its <k[:2]> directory along). Import the
names you need, not ``*``: the tests of this file would be collected twice.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import shutil
import stat
import threading
import uuid
from pathlib import Path

import pytest
from conftest import LINREG_PIPELINE, copy_project, make_project, state

from etforge.cache.entries import ENTRY_MANIFEST as MANIFEST
from etforge.cache.entries import SIGNATURE, read_entry
from etforge.cache.opening import signing_key
from etforge.cache.remote import MANIFEST_LIMIT, RemoteStore
from etforge.cache.store import Store

OUTSIDE_BYTES = b"etforge test: bytes that live outside the remote cache\n"
WARNING = "etforge: warning: "
CELL = "linreg/xnnpack/fp32"


# -- damages -----------------------------------------------------------------------------------


def outside_dir(remote_root: Path) -> Path:
    """Beside the remote root, never inside it: where damages put what their links point to."""
    path = remote_root.parent / f"{remote_root.name}-outside"
    path.mkdir(exist_ok=True)
    secret = path / "secret.txt"
    if not secret.exists():
        secret.write_bytes(OUTSIDE_BYTES)
    return path


def _entry(root: Path, key: str) -> Path:
    return root / key[:2] / key


def _load(entry: Path) -> dict:
    return json.loads((entry / MANIFEST).read_bytes())


def _save(entry: Path, manifest) -> None:
    (entry / MANIFEST).write_text(json.dumps(manifest))


def _victim(manifest: dict) -> str:
    """The blob a damage aims at: export.json when there is one (what the working tree shows)."""
    return "export.json" if "export.json" in manifest["files"] else sorted(manifest["files"])[0]


def _meta(data: bytes) -> dict:
    return {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}


def _aside(root: Path, what: str) -> Path:
    return outside_dir(root) / f"{what}-{uuid.uuid4().hex[:8]}"


def symlinked_blob(root, key):
    """A blob linked to a file outside, the manifest saying its sha256 and size."""
    entry = _entry(root, key)
    manifest = _load(entry)
    name = _victim(manifest)
    (entry / name).unlink()
    (entry / name).symlink_to(outside_dir(root) / "secret.txt")
    manifest["files"][name] = _meta(OUTSIDE_BYTES)
    _save(entry, manifest)


def symlinked_manifest(root, key):
    """The (otherwise good) manifest moved outside and linked back."""
    entry = _entry(root, key)
    target = _aside(root, "manifest")
    shutil.move(entry / MANIFEST, target)
    (entry / MANIFEST).symlink_to(target)


def symlinked_entry_dir(root, key):
    """The whole (otherwise good) entry moved outside and linked back."""
    entry = _entry(root, key)
    target = _aside(root, "entry")
    shutil.move(entry, target)
    entry.symlink_to(target, target_is_directory=True)


def symlinked_shard_dir(root, key):
    """The entry's <k[:2]> directory moved outside and linked back."""
    shard = root / key[:2]
    if shard.is_symlink():
        return
    target = _aside(root, "shard")
    shutil.move(shard, target)
    shard.symlink_to(target, target_is_directory=True)


def fifo_manifest(root, key):
    path = _entry(root, key) / MANIFEST
    path.unlink()
    os.mkfifo(path)


def fifo_blob(root, key):
    entry = _entry(root, key)
    path = entry / _victim(_load(entry))
    path.unlink()
    os.mkfifo(path)


def fifo_entry_dir(root, key):
    entry = _entry(root, key)
    shutil.rmtree(entry)
    os.mkfifo(entry)


def manifest_is_a_directory(root, key):
    path = _entry(root, key) / MANIFEST
    path.unlink()
    path.mkdir()


def blob_is_a_directory(root, key):
    entry = _entry(root, key)
    path = entry / _victim(_load(entry))
    path.unlink()
    path.mkdir()


def blob_larger_than_its_manifest_says(root, key):
    entry = _entry(root, key)
    with open(entry / _victim(_load(entry)), "ab") as blob:
        blob.write(b"\0" * (1 << 20))


def huge_manifest(root, key):
    """A well-formed manifest, padded past the reader's cap."""
    entry = _entry(root, key)
    manifest = _load(entry)
    manifest["info"]["padding"] = "x" * (MANIFEST_LIMIT + (1 << 20))
    _save(entry, manifest)


def _raw_manifest(data: bytes):
    def damage(root, key):
        (_entry(root, key) / MANIFEST).write_bytes(data)

    return damage


def _rewritten(change):
    """A damage that edits the parsed manifest with ``change(manifest, victim)``."""

    def damage(root, key):
        entry = _entry(root, key)
        manifest = _load(entry)
        _save(entry, change(manifest, _victim(manifest)) or manifest)

    return damage


def _parent_blob(root, key):
    """The manifest names '../evil', and '<shard>/evil' holds bytes matching it."""
    entry = _entry(root, key)
    (entry.parent / "evil").write_bytes(OUTSIDE_BYTES)
    manifest = _load(entry)
    manifest["files"]["../evil"] = _meta(OUTSIDE_BYTES)
    _save(entry, manifest)


def _absolute_blob(root, key):
    entry = _entry(root, key)
    manifest = _load(entry)
    manifest["files"][str(outside_dir(root) / "secret.txt")] = _meta(OUTSIDE_BYTES)
    _save(entry, manifest)


# Manifest damages: a bad manifest.json in an otherwise real entry (they apply to a local store too).
MANIFEST_DAMAGES = {
    "null file meta": _rewritten(lambda m, v: m["files"].update({v: None})),
    "files is a list": _rewritten(lambda m, v: m.update(files=sorted(m["files"]))),
    "size is a string": _rewritten(lambda m, v: m["files"][v].update(size=str(m["files"][v]["size"]))),
    "size is negative": _rewritten(lambda m, v: m["files"][v].update(size=-1)),
    "size is a float": _rewritten(lambda m, v: m["files"][v].update(size=float(m["files"][v]["size"]))),
    "size is a boolean": _rewritten(lambda m, v: m["files"][v].update(size=True)),
    "sha256 is missing": _rewritten(lambda m, v: m["files"][v].pop("sha256")),
    "sha256 in upper case": _rewritten(lambda m, v: m["files"][v].update(sha256=m["files"][v]["sha256"].upper())),
    "info is a list": _rewritten(lambda m, v: m.update(info=["ok"])),
    "key is a number": _rewritten(lambda m, v: m.update(key=42)),
    "manifest is a list": _rewritten(lambda m, v: [m]),
    "manifest is not JSON": _raw_manifest(b'{"files": {'),
    "manifest is not UTF-8": _raw_manifest(b'{"files": {}, "info": "\xff\xfe"}'),
    "manifest nested too deep": _raw_manifest(b"[" * 200_000 + b"]" * 200_000),
    "manifest names a ../ blob": _parent_blob,
    "manifest names an absolute blob": _absolute_blob,
}

HOSTILE_REMOTE_DAMAGES = {
    "symlinked blob": symlinked_blob,
    "symlinked manifest": symlinked_manifest,
    "symlinked entry dir": symlinked_entry_dir,
    "symlinked shard dir": symlinked_shard_dir,
    "FIFO manifest": fifo_manifest,
    "FIFO blob": fifo_blob,
    "FIFO entry dir": fifo_entry_dir,
    "manifest is a directory": manifest_is_a_directory,
    "blob is a directory": blob_is_a_directory,
    "blob larger than its manifest says": blob_larger_than_its_manifest_says,
    "huge manifest": huge_manifest,
    "manifest for another key": _rewritten(lambda m, v: m.update(key=hashlib.sha256(b"another").hexdigest())),
    **MANIFEST_DAMAGES,
}


def snapshot(directory: Path) -> dict:
    """Every path under ``directory`` with its type and, for regular files, bytes; no link followed."""
    seen = {}
    for path in sorted(directory.rglob("*")):
        st = path.lstat()
        body = path.read_bytes() if stat.S_ISREG(st.st_mode) else os.readlink(path) if path.is_symlink() else None
        seen[path.relative_to(directory).as_posix()] = (stat.S_IFMT(st.st_mode), body)
    return seen


def holds_outside_bytes(directory: Path) -> list:
    """Regular files under ``directory`` whose bytes include OUTSIDE_BYTES (a read through a damage)."""
    return [p for p in directory.rglob("*") if not p.is_symlink() and p.is_file() and OUTSIDE_BYTES in p.read_bytes()]


# -- the store, in process ----------------------------------------------------------------------

KEY = hashlib.sha256(b"a hostile entry").hexdigest()
BLOBS = {"export.json": b'{"program": "linreg"}\n', "program.pte": os.urandom(5000) + b"PTE"}
SECRET = b"shared between the writers"


def build_blobs(directory: Path) -> dict:
    directory.mkdir(parents=True, exist_ok=True)
    for name, data in BLOBS.items():
        (directory / name).write_bytes(data)
    return {name: directory / name for name in BLOBS}


def shared_entry(tmp_path: Path, secret: bytes | None = None) -> Path:
    """A shared directory holding one good entry KEY, uploaded as a writer would."""
    root = tmp_path / "shared"
    root.mkdir()
    writer = Store(
        tmp_path / "writer" / "cache",
        remote=RemoteStore(str(root), secret=secret),
        state_dir=tmp_path / "writer" / ".etforge",
    )
    writer.put(KEY, build_blobs(tmp_path / "built"), {"status": "ok"})
    read_entry(_entry(root, KEY))
    return root


def get_within(store: Store, key: str, seconds: float = 20):
    """store.get(key), failing the test when it does not return in time (a FIFO opened blocking)."""
    result = {}
    worker = threading.Thread(target=lambda: result.update(hit=store.get(key)), daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), f"store.get hung for {seconds} s"
    return result["hit"]


def warning_lines(err: str) -> list:
    return [line for line in err.splitlines() if line.startswith(WARNING)]


MODES = {"writable": (False, None), "read-only": (True, None), "signed read-only": (True, SECRET)}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("damage", HOSTILE_REMOTE_DAMAGES)
def test_a_hostile_remote_entry_is_a_miss_named_once_and_nothing_outside_is_touched(tmp_path, capsys, damage, mode):
    read_only, secret = MODES[mode]
    root = shared_entry(tmp_path, secret)
    HOSTILE_REMOTE_DAMAGES[damage](root, KEY)
    outside, remote_before = snapshot(outside_dir(root)), snapshot(root)
    capsys.readouterr()

    reader = Store(
        tmp_path / "cache",
        remote=RemoteStore(str(root), read_only=read_only, secret=secret),
        state_dir=tmp_path / ".etforge",
    )
    assert get_within(reader, KEY) is None and not reader.has(KEY)
    lines = warning_lines(capsys.readouterr().err)
    assert len(lines) == 1 and f"entry {KEY[:12]} " in lines[0], lines
    assert "treating it as a miss" in lines[0], lines
    other_worker = Store(
        tmp_path / "cache",
        remote=RemoteStore(str(root), read_only=read_only, secret=secret),
        state_dir=tmp_path / ".etforge",
    )
    other_worker.run_id = reader.run_id  # the same run: the entry is not named again
    assert get_within(other_worker, KEY) is None and get_within(reader, KEY) is None
    assert capsys.readouterr().err == ""
    assert holds_outside_bytes(tmp_path / "cache") == []
    assert snapshot(outside_dir(root)) == outside  # nothing outside written, moved or deleted
    if read_only:
        assert snapshot(root) == remote_before  # left in place
        return
    assert not os.path.lexists(_entry(root, KEY))  # set aside: no one tries it again
    # The rebuilt entry goes up in its place, into real directories of the share only.
    reader.put(KEY, build_blobs(tmp_path / "rebuilt"), {"status": "ok"})
    assert all(not p.is_symlink() for p in (root / KEY[:2], _entry(root, KEY), *_entry(root, KEY).iterdir()))
    assert read_entry(_entry(root, KEY))[0].keys() == BLOBS.keys()
    assert snapshot(outside_dir(root)) == outside
    assert capsys.readouterr().err == ""


def _signature_fifo(entry: Path, raw: bytes) -> None:
    os.mkfifo(entry / SIGNATURE)


def _signature_link(entry: Path, raw: bytes) -> None:
    """A link to a file outside holding the right signature: a reader following it would accept."""
    target = _aside(entry.parent.parent, "hmac")
    target.write_bytes(hmac.new(SECRET, raw, hashlib.sha256).hexdigest().encode())
    entry.joinpath(SIGNATURE).symlink_to(target)


def _signature_huge(entry: Path, raw: bytes) -> None:
    (entry / SIGNATURE).write_bytes(b"0" * (10 << 20))


@pytest.mark.parametrize("damage", [_signature_fifo, _signature_link, _signature_huge], ids=["FIFO", "link", "huge"])
def test_a_hostile_signature_file_is_a_miss_for_a_signed_reader(tmp_path, capsys, damage):
    root = shared_entry(tmp_path, SECRET)
    entry = _entry(root, KEY)
    (entry / SIGNATURE).unlink()
    damage(entry, (entry / MANIFEST).read_bytes())
    capsys.readouterr()
    reader = Store(tmp_path / "cache", remote=RemoteStore(str(root), read_only=True, secret=SECRET))
    assert get_within(reader, KEY) is None
    lines = warning_lines(capsys.readouterr().err)
    assert len(lines) == 1 and f"entry {KEY[:12]} is damaged: {SIGNATURE} is " in lines[0], lines


def test_a_writer_never_writes_through_a_link_planted_as_the_share_tmp_dir(tmp_path):
    root = tmp_path / "shared"
    root.mkdir()
    outside = outside_dir(root)
    (root / "tmp").symlink_to(outside, target_is_directory=True)
    before = snapshot(outside)
    writer = Store(tmp_path / "cache", remote=RemoteStore(str(root)), state_dir=tmp_path / ".etforge")
    writer.put(KEY, build_blobs(tmp_path / "built"), {"status": "ok"})
    assert snapshot(outside) == before
    assert (root / "tmp").is_dir() and not (root / "tmp").is_symlink()
    read_entry(_entry(root, KEY))


@pytest.mark.parametrize("damage", MANIFEST_DAMAGES)
def test_a_malformed_local_manifest_is_a_miss_and_is_discarded(tmp_path, damage):
    store = Store(tmp_path / "cache", state_dir=tmp_path / ".etforge")
    store.put(KEY, build_blobs(tmp_path / "built"), {"status": "ok"})
    MANIFEST_DAMAGES[damage](tmp_path / "cache", KEY)
    assert store.get(KEY) is None  # never a TypeError out of read_entry
    assert not store.entry_dir(KEY).exists()


@pytest.mark.parametrize(
    "value, why",
    [
        (None, "ETFORGE_CACHE_KEY is not set"),
        ("", "ETFORGE_CACHE_KEY is set but empty"),
        (" \n", "ETFORGE_CACHE_KEY is set but empty"),
        ("k", None),
    ],
)
def test_only_a_non_blank_key_signs(value, why):
    environ = {} if value is None else {"ETFORGE_CACHE_KEY": value}
    assert signing_key(environ) == ((None, why) if why else (b"k", None))


def test_a_missing_shared_directory_is_one_warning_and_is_never_created(tmp_path, capsys):
    share = tmp_path / "not-mounted"
    store = Store(tmp_path / "cache", remote=RemoteStore(str(share)), state_dir=tmp_path / ".etforge")
    store.check_remote()
    store.put(KEY, build_blobs(tmp_path / "built"), {"status": "ok"})
    assert store.get(hashlib.sha256(b"never built").hexdigest()) is None
    assert not share.exists()
    assert warning_lines(capsys.readouterr().err) == [
        f"{WARNING}remote cache {share}: no such directory (is the share mounted?); etforge does not create it; "
        "carrying on with the local cache for this run (misses are built here, what it cannot upload is "
        "uploaded by a later run)"
    ]
    assert (tmp_path / ".etforge" / "pending-uploads" / KEY).exists()  # owed to the share once it is back


# -- whole runs ---------------------------------------------------------------------------------


def remote_from(built, root: Path, secret: str | None = None) -> Path:
    """A shared directory holding every entry of ``built``'s cache (signed with ``secret``)."""
    root.mkdir()
    for entry in (built.root / "artifacts" / "cache").glob("??/*"):
        shutil.copytree(entry, root / entry.parent.name / entry.name)
        if secret:
            raw = (entry / MANIFEST).read_bytes()
            signature = hmac.new(secret.encode(), raw, hashlib.sha256).hexdigest()
            (root / entry.parent.name / entry.name / SIGNATURE).write_text(signature)
    return root


def key_of(built, task: str) -> str:
    return state(built, task)["key"]


def test_a_blob_linked_to_etc_hostname_never_reaches_the_working_tree(built_linreg, tmp_path):
    hostname = Path("/etc/hostname")
    if not hostname.is_file():
        pytest.skip("no /etc/hostname here")
    root = remote_from(built_linreg, tmp_path / "shared")
    key = key_of(built_linreg, f"export:{CELL}")
    blob = _entry(root, key) / "export.json"
    manifest = _load(_entry(root, key))
    blob.unlink()
    blob.symlink_to(hostname)
    manifest["files"]["export.json"] = _meta(hostname.read_bytes())
    _save(_entry(root, key), manifest)

    reader = make_project(tmp_path / "reader", LINREG_PIPELINE)
    run = reader.start_doit(f"export:{CELL}", extra_env={"ETFORGE_CACHE_REMOTE": str(root)}).finish(timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    export_json = Path(state(reader, f"export:{CELL}")["outputs"]["export.json"]["path"])
    assert export_json.read_bytes() != hostname.read_bytes()
    assert json.loads(export_json.read_bytes())["sha256"]  # the real one, rebuilt here
    assert state(reader, f"export:{CELL}")["cached"] is False and state(reader, "capture:linreg")["cached"] is True
    assert warning_lines(run.stderr) == [
        f"{WARNING}remote cache {root}: ETFORGE_CACHE_KEY is not set: entries are neither signed nor checked "
        "in this run",
        f"{WARNING}remote cache {root}: entry {key[:12]} is damaged: export.json is a symlink; "
        "treating it as a miss (set aside on the remote)",
    ], run.stderr
    assert not blob.is_symlink() and read_entry(_entry(root, key))  # the rebuilt entry replaced it


def test_a_fifo_manifest_hangs_no_worker_of_a_signed_run(built_linreg, tmp_path):
    secret = "correct horse battery staple"
    root = remote_from(built_linreg, tmp_path / "shared", secret=secret)
    capture = key_of(built_linreg, "capture:linreg")
    fifo_manifest(root, capture)
    reader = make_project(tmp_path / "reader", LINREG_PIPELINE + "thresholds: {fp32: {sqnr_db: 55}}\n")
    env = {"ETFORGE_CACHE_REMOTE": str(root), "ETFORGE_CACHE_KEY": secret, "ETFORGE_CACHE_READ_ONLY": "1"}
    run = reader.start_doit("-n", "2", "-P", "process", f"validate:{CELL}", extra_env=env).finish(timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert warning_lines(run.stderr) == [
        f"{WARNING}remote cache {root}: entry {capture[:12]} is damaged: manifest.json is a FIFO; "
        "treating it as a miss (the remote is read-only: left in place)"
    ], run.stderr
    assert state(reader, "capture:linreg")["cached"] is False  # rebuilt here
    assert state(reader, f"export:{CELL}")["cached"] is True  # its signed entry still serves
    assert state(reader, f"validate:{CELL}")["status"] == "ok"
    assert stat.S_ISFIFO((_entry(root, capture) / MANIFEST).lstat().st_mode)


def test_a_null_blob_in_a_remote_manifest_is_set_aside_and_the_run_finishes(built_linreg, tmp_path):
    root = remote_from(built_linreg, tmp_path / "shared", secret="k")  # the shape is checked before the HMAC
    key = key_of(built_linreg, f"export:{CELL}")
    MANIFEST_DAMAGES["null file meta"](root, key)
    reader = copy_project(built_linreg, tmp_path / "reader")
    shutil.rmtree(reader.root / "artifacts" / "cache")  # export and capture look their entries up again
    env = {"ETFORGE_CACHE_REMOTE": str(root), "ETFORGE_CACHE_KEY": "k"}
    run = reader.start_doit(f"export:{CELL}", extra_env=env).finish(timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "TypeError" not in run.stdout + run.stderr
    assert warning_lines(run.stderr) == [
        f"{WARNING}remote cache {root}: entry {key[:12]} is damaged: manifest.json: 'export.json' needs a "
        '"sha256" (64 lowercase hex digits) and a "size" (an integer >= 0); treating it as a miss '
        "(set aside on the remote)"
    ], run.stderr
    assert state(reader, f"export:{CELL}")["status"] == "ok"  # put back from its own working tree
    assert read_entry(_entry(root, key))  # and shared again: a whole entry replaced the damaged one


@pytest.mark.parametrize(
    "key, why", [("", "is set but empty"), (None, "is not set"), ("k", None)], ids=["empty", "unset", "set"]
)
def test_a_run_without_a_usable_signing_key_says_so_once(built_linreg, tmp_path, monkeypatch, key, why):
    monkeypatch.delenv("ETFORGE_CACHE_KEY", raising=False)
    root = tmp_path / "shared"
    root.mkdir()
    project = copy_project(built_linreg, tmp_path / "proj")
    shutil.rmtree(project.out)  # every task restores, in two workers, and offers its entry to the remote
    env = {"ETFORGE_CACHE_REMOTE": str(root), **({} if key is None else {"ETFORGE_CACHE_KEY": key})}
    run = project.start_doit("-n", "2", "-P", "process", extra_env=env).finish(timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    said = (
        [f"{WARNING}remote cache {root}: ETFORGE_CACHE_KEY {why}: entries are neither signed nor checked in this run"]
        if why
        else []
    )
    assert warning_lines(run.stderr) == said, run.stderr
    entries = list(root.glob("??/*"))
    assert len(entries) == 6 and sum((e / SIGNATURE).exists() for e in entries) == (0 if why else 6)


@pytest.mark.parametrize("read_only", [False, True], ids=["writable", "read-only"])
def test_a_shared_directory_that_does_not_exist_is_one_warning_and_is_never_created(built_linreg, tmp_path, read_only):
    share = tmp_path / "not-mounted"
    project = copy_project(built_linreg, tmp_path / "proj")
    shutil.rmtree(project.out)  # every task restores from the local cache and would share its entry
    env = {
        "ETFORGE_CACHE_REMOTE": str(share),
        "ETFORGE_CACHE_KEY": "k",
        **({"ETFORGE_CACHE_READ_ONLY": "1"} if read_only else {}),
    }
    run = project.start_doit("-n", "2", "-P", "process", extra_env=env).finish(timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    owed = "" if read_only else ", what it cannot upload is uploaded by a later run"
    assert warning_lines(run.stderr) == [
        f"{WARNING}remote cache {share}: no such directory (is the share mounted?); etforge does not create it; "
        f"carrying on with the local cache for this run (misses are built here{owed})"
    ], run.stderr
    assert not share.exists()
    pending = project.root / "artifacts" / ".etforge" / "pending-uploads"
    if read_only:
        assert not pending.exists()
        return
    assert len(list(pending.iterdir())) == 6
    share.mkdir()  # mounted again: the next run (nothing to build) uploads what was owed
    run = project.start_doit(extra_env=env).finish(timeout=300)
    assert run.returncode == 0 and run.started == set(), run.stdout + run.stderr
    assert "uploaded 6 entries an earlier run could not" in run.stderr and warning_lines(run.stderr) == []
    assert all(read_entry(entry) for entry in share.glob("??/*")) and len(list(share.glob("??/*"))) == 6
