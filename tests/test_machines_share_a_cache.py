"""Machines sharing one remote cache: CI shards build and upload, a fresh checkout only downloads.

Against a shared directory and a real S3-protocol server (moto) on loopback.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import uuid

import pytest
from conftest import LINREG_PIPELINE, aws_test_env, copy_project, free_port, make_bucket, make_project, state

from etforge.core.digest import canonical_json

BUCKET = "etforge-ci-cache"


@pytest.fixture(scope="module")
def s3_env(moto_endpoint, tmp_path_factory):
    make_bucket(moto_endpoint, BUCKET)
    return aws_test_env(tmp_path_factory.mktemp("aws"), moto_endpoint)


# s3 (moto) repeats every scenario over another fsspec transport: `make test-all`; the default
# run covers the S3 round trip in tests/test_remote_cache.py.
@pytest.fixture(params=["shared-dir", pytest.param("s3", marks=pytest.mark.slow)])
def remote_env(request, tmp_path):
    if request.param == "shared-dir":
        (tmp_path / "shared-cache").mkdir()  # the share exists: etforge never creates it
        return {"ETFORGE_CACHE_REMOTE": str(tmp_path / "shared-cache")}
    return {**request.getfixturevalue("s3_env"), "ETFORGE_CACHE_REMOTE": f"s3://{BUCKET}/{uuid.uuid4().hex}"}


def states(project) -> dict:
    return {p.stem: json.loads(p.read_text()) for p in (project.out / ".state").glob("*.json")}


# Two cells, one per shard (the stable split by cell name): each CI job builds its own and uploads it.
SHARDED = LINREG_PIPELINE.replace("  xnnpack: {}\n", "  xnnpack: {}\n  portable: {}\n")


def test_ci_shards_upload_and_a_fresh_checkout_downloads_everything(remote_env, tmp_path):
    for k in (1, 2):  # two CI jobs, each its own machine and empty local cache
        shard = make_project(tmp_path / f"shard{k}", SHARDED)
        run = shard.doit("--shard", f"{k}/2", extra_env=remote_env)
        assert run.returncode == 0, run.stdout + run.stderr
    programs = [list((tmp_path / f"shard{k}" / "artifacts" / "t").rglob("*.pte")) for k in (1, 2)]
    assert [len(p) for p in programs] == [1, 1]  # each shard built one cell
    built = {p.name: p.read_bytes() for p in programs[0] + programs[1]}
    assert len(built) == 2

    laptop = make_project(tmp_path / "laptop", SHARDED)
    run = laptop.doit(extra_env={**remote_env, "ETFORGE_CACHE_READ_ONLY": "1"})
    assert run.returncode == 0, run.stdout + run.stderr
    records = states(laptop)
    # Every cell task comes from the remote; only the matrix-wide manifests and report
    # (each shard saw half the matrix) are rendered here, from the downloaded records.
    assert {name for name, r in records.items() if not r["cached"]} == {"manifest", "report"}
    assert {p.name: p.read_bytes() for p in laptop.out.rglob("*.pte")} == built
    assert not list((laptop.out / "logs").glob("export__*")) if (laptop.out / "logs").exists() else True


@pytest.mark.slow  # tests/test_hostile_remote_entries.py covers damaged remote entries in the default run
def test_a_corrupt_remote_blob_is_discarded_and_rebuilt(tmp_path):
    shared = tmp_path / "shared-cache"
    shared.mkdir()
    env = {"ETFORGE_CACHE_REMOTE": str(shared)}
    first = make_project(tmp_path / "a")
    assert first.doit("export:linreg/xnnpack/fp32", extra_env=env).returncode == 0
    key = states(first)["export__linreg__xnnpack__fp32"]["key"]
    blob = shared / key[:2] / key / "program.pte"
    good = blob.read_bytes()
    blob.write_bytes(good[:-4] + b"evil")

    second = make_project(tmp_path / "b")
    run = second.doit("export:linreg/xnnpack/fp32", extra_env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    assert states(second)["export__linreg__xnnpack__fp32"]["cached"] is False  # rebuilt, not served
    assert (second.out / "linreg" / "linreg_xnnpack_fp32.pte").read_bytes() == good
    assert blob.read_bytes() == good  # and the remote holds a good copy again


# --- the remote is an accelerator, never a point of failure ------------------------------

CELL = "linreg/xnnpack/fp32"
STRICTER = "thresholds: {fp32: {sqnr_db: 55}}\n"
WARNING = "etforge: warning: remote cache"


def unreachable(tmp_path, url: str, read_only: bool) -> dict:
    """``url`` behind a closed loopback port (botocore asked to try once, to keep the test short)."""
    env = {
        **aws_test_env(tmp_path, f"http://127.0.0.1:{free_port()}"),
        "AWS_MAX_ATTEMPTS": "1",
        "ETFORGE_CACHE_REMOTE": url,
    }
    return {**env, "ETFORGE_CACHE_READ_ONLY": "1"} if read_only else env


def warnings(run) -> list:
    return [line for line in (run.stdout + run.stderr).splitlines() if WARNING in line]


def unsigned(url: str) -> str:
    """The run's one line saying that, without ETFORGE_CACHE_KEY, nothing is signed or checked."""
    return f"{WARNING} {url}: ETFORGE_CACHE_KEY is not set: entries are neither signed nor checked in this run"


# read-only: the cold store below covers an unreachable read-only remote in `make test-all`
@pytest.mark.parametrize(
    "read_only", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["writable", "read-only"]
)
def test_an_unreachable_remote_warns_once_and_the_local_cache_carries_the_run(
    built_linreg, tmp_path, read_only, s3_env
):
    url = f"s3://{BUCKET}/{uuid.uuid4().hex}"
    project = copy_project(built_linreg, tmp_path / "proj")
    shutil.rmtree(project.out)  # every task restores from the local cache (and offers it to the remote)
    project.write_pipeline(LINREG_PIPELINE + STRICTER)  # a validation the remote would be asked for
    run = project.doit("-n", "2", "-P", "process", extra_env=unreachable(tmp_path, url, read_only))
    assert run.returncode == 0, run.stdout + run.stderr
    assert len(warnings(run)) == 2 and warnings(run)[0] == unsigned(url), run.stdout + run.stderr
    assert "carrying on with the local cache" in warnings(run)[1] and "RemoteError" not in run.stdout
    assert state(project, f"validate:{CELL}")["status"] == "ok"
    pending = project.root / "artifacts" / ".etforge" / "pending-uploads"
    if read_only:
        assert not pending.exists()
        return
    owed = {p.name for p in pending.iterdir()}
    assert state(project, f"export:{CELL}")["key"] in owed and state(project, f"validate:{CELL}")["key"] in owed

    # The remote is back: the next run, with nothing to build, uploads what was owed.
    back = {**s3_env, "ETFORGE_CACHE_REMOTE": url}
    run = project.doit(extra_env=back)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.started == set() and warnings(run) == [unsigned(url)]
    assert f"uploaded {len(owed)} entries an earlier run could not" in run.stderr
    assert list(pending.iterdir()) == []
    laptop = make_project(tmp_path / "laptop", LINREG_PIPELINE + STRICTER)
    run = laptop.doit(f"validate:{CELL}", extra_env={**back, "ETFORGE_CACHE_READ_ONLY": "1"})
    assert run.returncode == 0, run.stdout + run.stderr
    assert all(state(laptop, t)["cached"] for t in ("capture:linreg", f"export:{CELL}", f"validate:{CELL}"))


@pytest.mark.slow  # the writable case above runs by default; this repeats it from a cold store
def test_a_cold_store_with_an_unreachable_read_only_remote_builds_locally(tmp_path):
    project = make_project(tmp_path / "proj", LINREG_PIPELINE)
    run = project.doit(f"export:{CELL}", extra_env=unreachable(tmp_path, f"s3://{BUCKET}/cold", read_only=True))
    assert run.returncode == 0, run.stdout + run.stderr
    assert len(warnings(run)) == 2 and warnings(run)[0] == unsigned(f"s3://{BUCKET}/cold"), run.stdout + run.stderr
    assert run.started == {"capture:linreg", f"export:{CELL}"}
    assert state(project, f"export:{CELL}")["cached"] is False and state(project, f"export:{CELL}")["status"] == "ok"


def test_a_signed_remote_ignores_unsigned_entries_and_trusts_its_own(built_linreg, tmp_path):
    (tmp_path / "shared-cache").mkdir()
    shared = {"ETFORGE_CACHE_REMOTE": str(tmp_path / "shared-cache")}
    signed = {**shared, "ETFORGE_CACHE_KEY": "correct horse battery staple"}
    task = f"export:{CELL}"
    unsigned_writer = copy_project(built_linreg, tmp_path / "a")
    shutil.rmtree(unsigned_writer.out)  # restored from its own cache, and uploaded without a signature
    assert unsigned_writer.doit(task, extra_env=shared).returncode == 0

    signer = make_project(tmp_path / "b", LINREG_PIPELINE)
    run = signer.doit(task, extra_env=signed)
    assert run.returncode == 0, run.stdout + run.stderr
    for name in ("capture:linreg", task):  # each unsigned entry named once, then built here
        key = state(signer, name)["key"]
        assert run.stderr.count(f"entry {key[:12]} is not signed; treating it as a miss") == 1, run.stderr
        assert state(signer, name)["cached"] is False

    reader = make_project(tmp_path / "c", LINREG_PIPELINE)
    run = reader.doit(task, extra_env={**signed, "ETFORGE_CACHE_READ_ONLY": "1"})
    assert run.returncode == 0, run.stdout + run.stderr
    assert not warnings(run)
    assert state(reader, "capture:linreg")["cached"] is True and state(reader, task)["cached"] is True
    assert (reader.out / "linreg" / "linreg_xnnpack_fp32.pte").read_bytes() == (
        signer.out / "linreg" / "linreg_xnnpack_fp32.pte"
    ).read_bytes()


DOUBLED = """\
from models.linreg import build as build_linreg


def build():
    model = build_linreg()
    model.linear.weight.data *= 2  # same signature as linreg, other outputs
    return model
"""

WITH_EVIL = LINREG_PIPELINE.replace(
    "backends:",
    """\
  evil:
    python: models.doubled:build
    inputs: [{name: features, shape: [1, 4]}]
backends:""",
)


def test_a_forged_program_does_not_inherit_the_passing_verdict(built_linreg, tmp_path):
    """Someone with write access puts another program under a cell's export key, with a
    self-consistent manifest; the cell's stored verdict judged other bytes, so it is not used."""
    (tmp_path / "shared-cache").mkdir()
    shared = {"ETFORGE_CACHE_REMOTE": str(tmp_path / "shared-cache")}
    writer = copy_project(built_linreg, tmp_path / "ci")
    shutil.rmtree(writer.out)  # linreg's entries come from its local cache and are uploaded
    (writer.root / "models" / "doubled.py").write_text(DOUBLED)
    writer.write_pipeline(WITH_EVIL)
    run = writer.doit(f"validate:{CELL}", "export:evil/xnnpack/fp32", extra_env=shared)
    assert run.returncode == 0, run.stdout + run.stderr

    good, evil = (state(writer, f"export:{m}/xnnpack/fp32")["key"] for m in ("linreg", "evil"))
    root = tmp_path / "shared-cache"
    target, source = root / good[:2] / good, root / evil[:2] / evil
    manifest = json.loads((source / "manifest.json").read_text())
    shutil.rmtree(target)
    shutil.copytree(source, target)
    (target / "manifest.json").write_text(canonical_json({**manifest, "key": good}))
    evil_sha = manifest["files"]["program.pte"]["sha256"]

    laptop = make_project(tmp_path / "laptop", WITH_EVIL)
    (laptop.root / "models" / "doubled.py").write_text(DOUBLED)
    run = laptop.doit(f"validate:{CELL}", extra_env={**shared, "ETFORGE_CACHE_READ_ONLY": "1"})
    assert run.returncode == 1, run.stdout + run.stderr
    assert f"validate:{CELL}: not using its stored result: it judged program sha256" in run.stderr
    pte = laptop.out / "linreg" / "linreg_xnnpack_fp32.pte"
    assert hashlib.sha256(pte.read_bytes()).hexdigest() == evil_sha  # the forged program did arrive
    verdict = state(laptop, f"validate:{CELL}")
    assert verdict["cached"] is False and verdict["status"] == "failed"  # judged again, on its real bytes
    assert verdict["info"]["program_sha256"] == evil_sha
    assert state(laptop, "capture:linreg")["cached"] is True  # consistent entries still serve
