"""Machines sharing one remote cache: CI shards build and upload, a fresh checkout only downloads.

Against a shared directory and a real S3-protocol server (moto) on loopback.
"""

from __future__ import annotations

import json
import socket
import uuid

import pytest

from conftest import make_project

BUCKET = "etforge-ci-cache"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def s3_env(tmp_path_factory):
    server_mod = pytest.importorskip("moto.server")
    home = tmp_path_factory.mktemp("aws")
    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=_free_port(), verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_CONFIG_FILE": str(home / "config"), "AWS_SHARED_CREDENTIALS_FILE": str(home / "credentials"),
           "AWS_ENDPOINT_URL": f"http://{host}:{port}"}
    import boto3

    boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], aws_access_key_id="testing",
                 aws_secret_access_key="testing", region_name="us-east-1").create_bucket(Bucket=BUCKET)
    yield env
    server.stop()


@pytest.fixture(params=["shared-dir", "s3"])
def remote_env(request, tmp_path):
    if request.param == "shared-dir":
        return {"ETFORGE_CACHE_REMOTE": str(tmp_path / "shared-cache")}
    return {**request.getfixturevalue("s3_env"), "ETFORGE_CACHE_REMOTE": f"s3://{BUCKET}/{uuid.uuid4().hex}"}


def states(project) -> dict:
    return {p.stem: json.loads(p.read_text()) for p in (project.out / ".state").glob("*.json")}


def test_ci_shards_upload_and_a_fresh_checkout_downloads_everything(remote_env, tmp_path):
    for k in (1, 2):  # two CI jobs, each its own machine and empty local cache
        shard = make_project(tmp_path / f"shard{k}")
        run = shard.doit(f"shard={k}/2", extra_env=remote_env)
        assert run.returncode == 0, run.stdout + run.stderr
    built = {p.name: p.read_bytes() for k in (1, 2) for p in (tmp_path / f"shard{k}" / "artifacts" / "t").rglob("*.pte")}
    assert len(built) == 4

    laptop = make_project(tmp_path / "laptop")
    run = laptop.doit(extra_env={**remote_env, "ETFORGE_CACHE_READ_ONLY": "1"})
    assert run.returncode == 0, run.stdout + run.stderr
    records = states(laptop)
    # Every cell task comes from the remote; only the matrix-wide manifests and report
    # (each shard saw half the matrix) are rendered here, from the downloaded records.
    assert {name for name, r in records.items() if not r["cached"]} == {"manifest", "report"}
    assert {p.name: p.read_bytes() for p in laptop.out.rglob("*.pte")} == built
    assert not list((laptop.out / "logs").glob("export__*")) if (laptop.out / "logs").exists() else True


def test_a_corrupt_remote_blob_is_discarded_and_rebuilt(tmp_path):
    shared = tmp_path / "shared-cache"
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
