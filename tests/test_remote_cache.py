"""The shared remote cache (etforge.cache.remote) against a real S3-protocol server and a shared directory.

The S3 side is moto's server (``moto[server]``) listening on 127.0.0.1 at a free port,
started once for the session (tests/conftest.py); s3fs talks to it over HTTP exactly as it would to AWS.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from conftest import free_port

from etforge.cache.entries import ENTRY_MANIFEST as MANIFEST
from etforge.cache.entries import SIGNATURE
from etforge.cache.remote import DamagedEntry, RemoteError, RemoteStore, UntrustedEntry, remote_from_url
from etforge.cache.store import Store

REPO = Path(__file__).resolve().parent.parent
BUCKET = "etforge-cache"
KEY = hashlib.sha256(b"an entry").hexdigest()


@pytest.fixture(scope="module")
def s3_endpoint(moto_endpoint, tmp_path_factory):
    pytest.importorskip("s3fs")
    home = tmp_path_factory.mktemp("aws")
    with pytest.MonkeyPatch.context() as mp:
        # Dummy credentials, and no real AWS configuration leaking in from the host.
        mp.setenv("AWS_ACCESS_KEY_ID", "testing")
        mp.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        mp.setenv("AWS_DEFAULT_REGION", "us-east-1")
        mp.setenv("AWS_CONFIG_FILE", str(home / "config"))
        mp.setenv("AWS_SHARED_CREDENTIALS_FILE", str(home / "credentials"))
        for var in ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
            mp.delenv(var, raising=False)
        import s3fs

        s3fs.S3FileSystem(client_kwargs={"endpoint_url": moto_endpoint}, skip_instance_cache=True).mkdir(BUCKET)
        yield moto_endpoint


@pytest.fixture(params=["dir", "s3"])
def remote(request, tmp_path):
    """A factory of RemoteStores on one fresh remote location (shared dir or S3 prefix)."""
    if request.param == "dir":
        url = str(tmp_path / "shared")
        (tmp_path / "shared").mkdir()  # the share exists: etforge never creates it
        options = {}
    else:
        endpoint = request.getfixturevalue("s3_endpoint")
        url = f"s3://{BUCKET}/{uuid.uuid4().hex}"
        options = {"client_kwargs": {"endpoint_url": endpoint}}

    def make(read_only=False, secret=None) -> RemoteStore:
        return RemoteStore(url, read_only=read_only, storage_options=options, secret=secret)

    make.kind = request.param
    return make


def make_entry(directory: Path, key: str = KEY, blobs: dict | None = None) -> Path:
    """A local store entry: blobs plus manifest.json, in the local Store's format."""
    blobs = blobs or {"model.pte": os.urandom(70_000) + b"PTE", "model.export.json": b'{"size": 3}'}
    directory.mkdir(parents=True)
    manifest = {"key": key, "files": {}, "info": {"status": "ok"}}
    for name, data in blobs.items():
        (directory / name).write_bytes(data)
        manifest["files"][name] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    (directory / MANIFEST).write_text(json.dumps(manifest, sort_keys=True, separators=(",", ":")))
    return directory


def tree(directory: Path) -> dict:
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def remote_path(store: RemoteStore, key: str, name: str = "") -> str:
    _, root = store._filesystem()
    return f"{root}/{key[:2]}/{key}" + (f"/{name}" if name else "")


def test_round_trip_is_byte_identical(remote, tmp_path):
    entry = make_entry(tmp_path / "local" / KEY)
    writer = remote()
    writer.upload(KEY, entry)
    dest = tmp_path / "fetched"
    dest.mkdir()
    assert remote(read_only=True).fetch(KEY, dest) is True  # another client, as machine B would be
    assert tree(dest) == tree(entry)
    # Every blob checks out against the manifest, as the local store will verify it.
    manifest = json.loads((dest / MANIFEST).read_text())
    for name, meta in manifest["files"].items():
        assert hashlib.sha256((dest / name).read_bytes()).hexdigest() == meta["sha256"]


def test_upload_of_an_existing_entry_is_a_no_op(remote, tmp_path):
    store = remote()
    store.upload(KEY, make_entry(tmp_path / "a" / KEY))
    fs, _ = store._filesystem()
    before = fs.info(remote_path(store, KEY, MANIFEST))
    time.sleep(0.05)
    store.upload(KEY, tmp_path / "a" / KEY)
    fs.invalidate_cache()
    after = fs.info(remote_path(store, KEY, MANIFEST))
    stamp = "mtime" if remote.kind == "dir" else "LastModified"
    assert before[stamp] == after[stamp]


def test_missing_key_is_a_miss(remote, tmp_path):
    dest = tmp_path / "fetched"
    dest.mkdir()
    assert remote().fetch(hashlib.sha256(b"never built").hexdigest(), dest) is False
    assert list(dest.iterdir()) == []


def test_partial_upload_without_manifest_is_a_miss(remote, tmp_path):
    store = remote()
    store.upload(KEY, make_entry(tmp_path / "local" / KEY))
    fs, _ = store._filesystem()
    fs.rm_file(remote_path(store, KEY, MANIFEST))  # as if the writer died before publishing it
    dest = tmp_path / "fetched"
    dest.mkdir()
    assert store.fetch(KEY, dest) is False
    assert list(dest.iterdir()) == []


def test_manifest_with_a_missing_blob_is_a_miss(remote, tmp_path):
    store = remote()
    store.upload(KEY, make_entry(tmp_path / "local" / KEY))
    fs, _ = store._filesystem()
    fs.rm_file(remote_path(store, KEY, "model.pte"))
    dest = tmp_path / "fetched"
    dest.mkdir()
    assert store.fetch(KEY, dest) is False
    assert list(dest.iterdir()) == []  # nothing half-downloaded left behind


def test_read_only_refuses_upload_and_discard(remote, tmp_path):
    entry = make_entry(tmp_path / "local" / KEY)
    reader = remote(read_only=True)
    with pytest.raises(RemoteError, match="read-only"):
        reader.upload(KEY, entry)
    dest = tmp_path / "fetched"
    dest.mkdir()
    assert reader.fetch(KEY, dest) is False  # and nothing was written to the remote
    remote().upload(KEY, entry)
    reader.discard(KEY)  # a no-op: the entry stays
    assert reader.fetch(KEY, dest) is True


def test_hostile_manifest_names_are_refused(remote, tmp_path):
    store = remote()
    fs, _ = store._filesystem()
    entry = remote_path(store, KEY)
    payload = b"pwned"
    fs.makedirs(entry, exist_ok=True)
    # The blob sits where a naive '<entry>/../evil' would find it.
    fs.pipe_file(f"{entry.rsplit('/', 1)[0]}/evil", payload)
    fs.pipe_file(f"{entry}/ok.pte", b"fine")
    for hostile in ("../evil", "/tmp/evil-abs", ".hidden", "sub/evil", "..", MANIFEST):
        manifest = {
            "key": KEY,
            "info": {},
            "files": {
                "ok.pte": {"sha256": hashlib.sha256(b"fine").hexdigest(), "size": 4},
                hostile: {"sha256": hashlib.sha256(payload).hexdigest(), "size": len(payload)},
            },
        }
        fs.pipe_file(f"{entry}/{MANIFEST}", json.dumps(manifest).encode())
        fs.invalidate_cache()
        box = tmp_path / f"box-{uuid.uuid4().hex[:6]}"
        dest = box / "dest"
        dest.mkdir(parents=True)
        with pytest.raises(DamagedEntry, match=rf"entry {KEY[:12]} is damaged: manifest.json names a blob outside"):
            store.fetch(KEY, dest)
        assert tree(box) == {}, hostile  # nothing in dest, nothing beside it
    assert not Path("/tmp/evil-abs").exists()


def test_manifest_for_another_key_or_garbage_is_a_miss(remote, tmp_path):
    store = remote()
    other = hashlib.sha256(b"other").hexdigest()
    store.upload(other, make_entry(tmp_path / "local" / other, key=other))
    fs, _ = store._filesystem()
    fs.makedirs(remote_path(store, KEY), exist_ok=True)
    # Copy the other entry's manifest under KEY: it vouches for a different key.
    fs.pipe_file(remote_path(store, KEY, MANIFEST), fs.cat_file(remote_path(store, other, MANIFEST)))
    for name in json.loads(fs.cat_file(remote_path(store, other, MANIFEST)))["files"]:
        fs.pipe_file(remote_path(store, KEY, name), fs.cat_file(remote_path(store, other, name)))
    dest = tmp_path / "fetched"
    dest.mkdir()
    with pytest.raises(DamagedEntry, match="manifest.json is for another key$"):
        store.fetch(KEY, dest)
    fs.pipe_file(remote_path(store, KEY, MANIFEST), b"{not json")
    with pytest.raises(DamagedEntry, match=r"manifest.json is not JSON \(Expecting property name"):
        store.fetch(KEY, dest)
    assert list(dest.iterdir()) == []


def test_discard_removes_the_entry_and_a_rebuild_replaces_it(remote, tmp_path):
    store = remote()
    store.upload(KEY, make_entry(tmp_path / "local" / KEY))
    fs, root = store._filesystem()
    # Corrupt a blob in place (same size); the caller's sha256 check catches it and discards.
    good = fs.cat_file(remote_path(store, KEY, "model.pte"))
    fs.pipe_file(remote_path(store, KEY, "model.pte"), b"X" * len(good))
    store.discard(KEY)
    fs.invalidate_cache()
    assert not fs.exists(remote_path(store, KEY, MANIFEST))
    assert not fs.exists(remote_path(store, KEY, "model.pte"))
    dest = tmp_path / "fetched"
    dest.mkdir()
    assert store.fetch(KEY, dest) is False
    store.discard(KEY)  # discarding a missing entry is fine
    # The rebuilt entry uploads again and round-trips.
    rebuilt = make_entry(tmp_path / "rebuilt" / KEY)
    store.upload(KEY, rebuilt)
    assert store.fetch(KEY, dest) is True
    assert tree(dest) == tree(rebuilt)
    if remote.kind == "dir":  # no staging or trash directories left on the share
        assert list((Path(root) / "tmp").iterdir()) == []


def test_stale_entry_is_replaced_on_upload(remote, tmp_path):
    store = remote()
    store.upload(KEY, make_entry(tmp_path / "old" / KEY, blobs={"a.bin": b"old", "gone.bin": b"x"}))
    fresh = make_entry(tmp_path / "new" / KEY, blobs={"a.bin": b"new!"})
    store.upload(KEY, fresh)
    dest = tmp_path / "fetched"
    dest.mkdir()
    assert store.fetch(KEY, dest) is True
    assert tree(dest) == tree(fresh)


def test_shared_directory_by_file_url(tmp_path):
    share = tmp_path / "share"
    share.mkdir()
    entry = make_entry(tmp_path / "local" / KEY)
    remote_from_url(f"file://{share}").upload(KEY, entry)
    assert (share / KEY[:2] / KEY / MANIFEST).is_file()
    assert sorted(p.name for p in share.iterdir()) == sorted([KEY[:2], "tmp"])
    dest = tmp_path / "fetched"
    dest.mkdir()
    assert remote_from_url(str(share), read_only=True).fetch(KEY, dest) is True
    assert tree(dest) == tree(entry)


def test_endpoint_from_environment(s3_endpoint, tmp_path, monkeypatch):
    """How users point etforge at a non-AWS S3 server: AWS_ENDPOINT_URL (read by botocore)."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    url = f"s3://{BUCKET}/env-{uuid.uuid4().hex}"
    store = remote_from_url(url)
    # A fresh client that reads the env (and no endpoint in storage_options): were the
    # variable ignored, s3fs would try real AWS, which is unreachable here, and raise.
    store.storage_options["skip_instance_cache"] = True
    entry = make_entry(tmp_path / "local" / KEY)
    store.upload(KEY, entry)
    dest = tmp_path / "fetched"
    dest.mkdir()
    reader = remote_from_url(url, read_only=True)
    reader.storage_options["skip_instance_cache"] = True
    assert reader.fetch(KEY, dest) is True
    assert tree(dest) == tree(entry)


def test_unreachable_remote_raises_one_line_error(tmp_path):
    pytest.importorskip("s3fs")
    url = f"s3://{BUCKET}/nowhere"
    store = RemoteStore(
        url,
        storage_options={
            "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{free_port()}"},  # nothing listens
            "key": "testing",
            "secret": "testing",
            "config_kwargs": {"retries": {"max_attempts": 1}, "connect_timeout": 2},
        },
    )
    dest = tmp_path / "fetched"
    dest.mkdir()
    start = time.monotonic()
    with pytest.raises(RemoteError) as err:
        store.fetch(KEY, dest)
    assert time.monotonic() - start < 20
    message = str(err.value)
    assert "\n" not in message and url in message
    assert "EndpointConnectionError" in message  # the connection failed, not our configuration
    assert list(dest.iterdir()) == []


def test_missing_backend_package_is_a_clear_error():
    try:
        import gcsfs  # noqa: F401
    except ImportError:
        with pytest.raises(RemoteError, match=r"^remote cache gs://b/p: gs:// needs gcsfs: pip install gcsfs$"):
            remote_from_url("gs://b/p")
    else:
        pytest.skip("gcsfs is installed")
    assert remote_from_url(None) is None and remote_from_url("  ") is None


def test_importing_and_configuring_does_not_import_fsspec():
    code = (
        "import sys; from etforge.cache.remote import remote_from_url; "
        "r = remote_from_url('s3://b/p', read_only=True); remote_from_url('/tmp/x'); "
        "bad = [m for m in ('fsspec', 's3fs', 'botocore', 'aiobotocore') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)


def _fetch_in_child(store, key, dest, queue):
    queue.put(store.fetch(key, Path(dest)))


def test_store_made_before_fork_works_in_a_worker(remote, tmp_path):
    """doit -P process forks workers after planning; the async S3 client must not be reused."""
    import multiprocessing

    store = remote()
    entry = make_entry(tmp_path / "local" / KEY)
    store.upload(KEY, entry)  # the parent has a live client now
    dest = tmp_path / "fetched"
    dest.mkdir()
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_fetch_in_child, args=(store, KEY, str(dest), queue))
    child.start()
    child.join(30)
    assert child.exitcode == 0 and queue.get(timeout=5) is True
    assert tree(dest) == tree(entry)


def test_upload_to_a_missing_bucket_is_a_remote_error(s3_endpoint, tmp_path):
    store = RemoteStore("s3://no-such-bucket/p", storage_options={"client_kwargs": {"endpoint_url": s3_endpoint}})
    dest = tmp_path / "fetched"
    dest.mkdir()
    assert store.fetch(KEY, dest) is False  # reading: just a miss
    with pytest.raises(RemoteError, match=r"^remote cache s3://no-such-bucket/p: cannot upload"):
        store.upload(KEY, make_entry(tmp_path / "local" / KEY))


SECRET = b"shared between the writers"


def test_a_signed_reader_accepts_only_entries_signed_with_its_secret(remote, tmp_path):
    entry = make_entry(tmp_path / "local" / KEY)
    remote().upload(KEY, entry)  # a writer without the secret
    reader = remote(read_only=True, secret=SECRET)
    dest = tmp_path / "fetched"
    dest.mkdir()
    with pytest.raises(UntrustedEntry, match=rf"entry {KEY[:12]} is not signed; treating it as a miss$"):
        reader.fetch(KEY, dest)
    assert list(dest.iterdir()) == []  # refused before any blob came down

    remote(secret=SECRET).upload(KEY, entry)  # unsigned on the remote: not complete for a signer, replaced
    assert reader.fetch(KEY, dest) is True
    assert tree(dest) == tree(entry)  # the signature stays on the remote
    with pytest.raises(UntrustedEntry, match="does not match ETFORGE_CACHE_KEY"):
        remote(read_only=True, secret=b"another team's key").fetch(KEY, tmp_path / "other")
    assert remote(read_only=True).fetch(KEY, tmp_path / "plain") is True  # without a secret, nothing changes


def test_a_tampered_signed_entry_is_refused(remote, tmp_path):
    store = remote(secret=SECRET)
    store.upload(KEY, make_entry(tmp_path / "local" / KEY))
    fs, _ = store._filesystem()
    # Swap a blob and rewrite the manifest to match it: consistent, but not what was signed.
    evil = b"another program"
    manifest = json.loads(fs.cat_file(remote_path(store, KEY, MANIFEST)))
    manifest["files"]["model.pte"] = {"sha256": hashlib.sha256(evil).hexdigest(), "size": len(evil)}
    fs.pipe_file(remote_path(store, KEY, "model.pte"), evil)
    fs.pipe_file(remote_path(store, KEY, MANIFEST), json.dumps(manifest).encode())
    fs.invalidate_cache()
    assert fs.exists(remote_path(store, KEY, SIGNATURE))
    with pytest.raises(UntrustedEntry, match="does not match"):
        store.fetch(KEY, tmp_path / "fetched")


def test_the_store_warns_once_per_untrusted_entry_and_treats_it_as_a_miss(tmp_path, capsys):
    shared = tmp_path / "shared"
    shared.mkdir()
    RemoteStore(str(shared)).upload(KEY, make_entry(tmp_path / "local" / KEY))
    store = Store(tmp_path / "cache", remote=RemoteStore(str(shared), read_only=True, secret=SECRET))
    assert store.get(KEY) is None and store.get(KEY) is None
    assert not store.has(KEY)
    assert capsys.readouterr().err.count(f"entry {KEY[:12]} is not signed") == 1


def test_a_failing_remote_warns_once_per_run_and_owes_the_uploads(tmp_path, capsys):
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("a file where the shared directory should be")
    store = Store(tmp_path / "cache", remote=RemoteStore(str(blocked)), state_dir=tmp_path / ".etforge")
    keys = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(3)]
    for key in keys:
        source = make_entry(tmp_path / "built" / key, key=key)
        store.put(key, {n: source / n for n in ("model.pte", "model.export.json")}, {"status": "ok"})
        assert store.get(hashlib.sha256(b"never built").hexdigest()) is None  # a miss: built locally
    err = capsys.readouterr().err
    assert err.count("etforge: warning: remote cache") == 1, err
    assert "carrying on with the local cache for this run" in err
    assert sorted(p.name for p in (tmp_path / ".etforge" / "pending-uploads").iterdir()) == sorted(keys)

    same_run_other_worker = Store(tmp_path / "cache", remote=RemoteStore(str(blocked)), state_dir=tmp_path / ".etforge")
    same_run_other_worker.run_id = store.run_id
    assert same_run_other_worker.get(keys[0]) is not None  # the local hit; the remote is not tried again
    assert capsys.readouterr().err == ""

    blocked.unlink()  # the share is back: a later run uploads what is owed
    blocked.mkdir()
    later = Store(tmp_path / "cache", remote=RemoteStore(str(blocked)), state_dir=tmp_path / ".etforge")
    assert later.has_pending() and later.upload_pending() == 3 and not later.has_pending()
    for key in keys:
        assert (blocked / key[:2] / key / MANIFEST).is_file()
