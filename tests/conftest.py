"""Shared helpers: a throwaway etforge project, a way to run doit on it, and an S3 server."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# The modules that take longest on one worker (seconds measured with --durations, 2 cores), longest
# first. `make test` hands whole modules to its workers (--dist loadfile) in collection order, and
# pytest-xdist would otherwise order them by test count, which puts these few-test, long modules
# last and leaves one worker finishing them alone; longest first keeps the workers busy to the end.
LONGEST_FIRST = (  # seconds each took in a full run (--durations), for balancing the workers
    "test_faults_recover.py",  # 320
    "test_build_once_rebuild_what_changed.py",  # 250
    "test_releases_are_reproducible.py",  # 186
    "test_machines_share_a_cache.py",  # 165
    "test_keys_cover_every_input.py",  # 162
    "test_llm_export_and_decode.py",  # 122
    "test_aarch64_targets.py",  # 100
    "test_quantized_cells.py",  # 95
    "test_weight_group_schemes.py",  # 82
    "test_accuracy_rescue.py",  # 74
    "test_encoders_with_padding_masks.py",  # 68
    "test_hf_tasks.py",  # 60
    "test_hf_seq2seq.py",  # 60
    "test_dynamic_shapes.py",  # 57
    "test_installed_tool.py",  # 53
    "test_numerics_against_eager.py",  # 53
    "test_llm_families.py",  # 53
    "test_html_report.py",  # 50
    "test_llm_schemes.py",  # 50
    "test_repro.py",  # 43
)


def pytest_collection_modifyitems(items) -> None:
    """Longest modules first (LONGEST_FIRST), then the other end-to-end modules, then the unit tests."""

    def rank(item) -> tuple:
        path = Path(str(item.fspath))
        if path.name in LONGEST_FIRST:
            return (0, LONGEST_FIRST.index(path.name))
        return (1, 0) if path.parent.name == "tests" else (2, 0)

    items.sort(key=rank)  # stable: each module keeps its own order


START_LINE = re.compile(r"^\[\d\d:\d\d:\d\d\] start\s+(\S+)$", re.M)

SMALL_PIPELINE = """\
name: t
version: 0.0.1
models:
  linreg:
    python: models.linreg:build
    inputs: [{name: features, shape: [1, 4]}]
  cnn:
    python: models.small_cnn:build
    kwargs: {num_classes: 3, width: 4}
    inputs: [{name: image, shape: [1, 3, 8, 8]}]
backends:
  xnnpack: {}
  portable: {}
quantization: [fp32]
targets: false
"""

# One cell: the smallest real pipeline (capture, export, validate, benchmark, manifest, report).
LINREG_PIPELINE = """\
name: t
version: 0.0.1
models:
  linreg:
    python: models.linreg:build
    inputs: [{name: features, shape: [1, 4]}]
backends:
  xnnpack: {}
quantization: [fp32]
targets: false
"""


@dataclass
class DoitRun:
    returncode: int
    stdout: str
    stderr: str

    @property
    def started(self) -> set:
        """Names of the tasks whose actions ran."""
        return set(START_LINE.findall(self.stdout))


@dataclass
class Project:
    root: Path

    @property
    def pipeline(self) -> Path:
        return self.root / "pipeline.yaml"

    @property
    def out(self) -> Path:
        return self.root / "artifacts" / "t"

    def write_pipeline(self, text: str) -> None:
        self.pipeline.write_text(text)

    def doit(self, *args: str, extra_env: dict | None = None) -> DoitRun:
        return self.start_doit(*args, extra_env=extra_env).finish()

    def start_doit(self, *args: str, extra_env: dict | None = None) -> StartedDoit:
        """Start doit without waiting for it (see doit_concurrently)."""
        env = {**os.environ, "ETFORGE_PIPELINE": str(self.pipeline), **(extra_env or {})}
        proc = subprocess.Popen(
            [sys.executable, "-m", "etforge", *args],
            cwd=self.root,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        return StartedDoit(proc)


@dataclass
class StartedDoit:
    proc: subprocess.Popen

    def finish(self, timeout: float = 900) -> DoitRun:
        try:
            stdout, stderr = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
            raise
        return DoitRun(self.proc.returncode, stdout, stderr)


def cpp_probe_lines(source: str, include_dir: Path, tmp_path: Path) -> list:
    """Compile ``source`` (strict C++17) against the headers in ``include_dir``, run it, return its lines."""
    probe, exe = tmp_path / "probe.cpp", tmp_path / "probe"
    probe.write_text(source)
    compiled = subprocess.run(
        [
            "c++",
            "-std=c++17",
            "-Wall",
            "-Wextra",
            "-pedantic",
            "-Werror",
            "-I",
            str(include_dir),
            str(probe),
            "-o",
            str(exe),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert compiled.returncode == 0, compiled.stderr
    return subprocess.run([str(exe)], capture_output=True, text=True, timeout=30).stdout.splitlines()


def cmake_probe_lines(script: str, manifest: Path, tmp_path: Path) -> list:
    """Run a ``cmake -P`` script with ``-DMANIFEST=<manifest>``; its message() lines (stderr)."""
    path = tmp_path / "probe.cmake"
    path.write_text(script)
    run = subprocess.run(
        ["cmake", f"-DMANIFEST={manifest}", "-P", str(path)], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    return run.stderr.splitlines()


# A tiny untied Llama (2 layers, hidden 64, vocab 512) for transformers text-generation tests:
# random tied-embedding configs emit one constant token, so greedy agreement would prove nothing.
TINY_LLAMA_CONFIG = (
    "{model_type: llama, vocab_size: 512, hidden_size: 64, intermediate_size: 128, "
    "num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2, "
    "max_position_embeddings: 64, tie_word_embeddings: false, bos_token_id: 1, "
    "eos_token_id: 2, pad_token_id: 0}"
)
# A tiny Whisper from its config. Untied output embeddings: a tied random Whisper repeats its start
# token, which would make a greedy check prove nothing (measured: [1, 1, 1, ...] tied,
# [243, 140, 13, 148, ...] untied).
TINY_WHISPER_CONFIG = (
    "{model_type: whisper, vocab_size: 256, num_mel_bins: 16, d_model: 32, encoder_layers: 1, decoder_layers: 1, "
    "encoder_attention_heads: 2, decoder_attention_heads: 2, encoder_ffn_dim: 64, decoder_ffn_dim: 64, "
    "max_source_positions: 16, max_target_positions: 32, decoder_start_token_id: 1, pad_token_id: 0, "
    "bos_token_id: 1, eos_token_id: 2, tie_word_embeddings: false}"
)


def doit_concurrently(*runs: tuple) -> list:
    """Run doit on independent projects at once: ``(project, args, extra_env)`` each, extra_env
    optional; their DoitRuns in order. Each is its own process, as on separate machines; on two
    cores this roughly halves the wall time of builds that mostly import and lower on one thread."""
    started = [project.start_doit(*args, extra_env=env[0] if env else None) for project, args, *env in runs]
    return [s.finish() for s in started]


def make_project(path: Path, pipeline: str = SMALL_PIPELINE) -> Project:
    shutil.copytree(REPO / "models", path / "models", ignore=shutil.ignore_patterns("__pycache__"))
    project = Project(path)
    project.write_pipeline(pipeline)
    return project


@pytest.fixture
def project(tmp_path) -> Project:
    return make_project(tmp_path / "proj")


@pytest.fixture(scope="session")
def built_linreg(tmp_path_factory) -> Project:
    """LINREG_PIPELINE built once for the session, without a remote; copy it (copy_project) to change it."""
    project = make_project(tmp_path_factory.mktemp("linreg") / "proj", LINREG_PIPELINE)
    run = project.doit()
    assert run.returncode == 0, run.stdout + run.stderr
    return project


@pytest.fixture(scope="session")
def built_small(tmp_path_factory) -> Project:
    """SMALL_PIPELINE (4 cells) built once for the session by ``doit -n 2 -P process`` (every task,
    manifest and report included), without a remote; ``first_run`` is that run. Never change it:
    copy it (copy_project) and change the copy."""
    project = make_project(tmp_path_factory.mktemp("small") / "proj", SMALL_PIPELINE)
    run = project.doit("-n", "2", "-P", "process")
    assert run.returncode == 0, run.stdout + run.stderr
    project.first_run = run
    return project


def state(project: Project, task: str) -> dict:
    """The state record of ``task`` (e.g. export:linreg/xnnpack/fp32)."""
    name = task.replace(":", "__").replace("/", "__") + ".json"
    return json.loads((project.out / ".state" / name).read_text())


def check(info: dict, kind: str) -> dict:
    """The JSON form of the ``kind`` check (etforge.checks: "numerics", "delegation", "size", "vela",
    "on_device") a task's result holds (a record's ``info``), or {} when it holds none."""
    return next((c for c in (info or {}).get("checks") or () if c.get("check") == kind), {})


def copy_project(source: Project, target: Path) -> Project:
    """A copy of a built project, cache and state included, mtimes kept (a relocated checkout)."""
    shutil.copytree(source.root, target, symlinks=True)
    copy = Project(target)
    if hasattr(source, "first_run"):
        copy.first_run = source.first_run
    return copy


def free_port() -> int:
    """A loopback port nothing listens on (until someone binds it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def moto_endpoint():
    """A real S3-protocol server (moto) on loopback, for the session; its URL."""
    server_mod = pytest.importorskip("moto.server")
    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=free_port(), verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


def aws_test_env(home: Path, endpoint: str) -> dict:
    """Environment for a doit subprocess talking to ``endpoint``: dummy credentials, no host AWS config."""
    return {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_CONFIG_FILE": str(home / "config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(home / "credentials"),
        "AWS_ENDPOINT_URL": endpoint,
    }


def make_bucket(endpoint: str, bucket: str) -> None:
    import boto3

    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    )
    try:
        client.create_bucket(Bucket=bucket)
    except client.exceptions.BucketAlreadyOwnedByYou:
        pass


# ---------------------------------------------------------------- faults (test_faults_recover, test_random_faults_heal)


def start_doit(project, *args):
    env = {**os.environ, "ETFORGE_PIPELINE": str(project.pipeline)}
    return subprocess.Popen(
        [sys.executable, "-m", "etforge", *args],
        cwd=project.root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def wait_for_line(proc, needle: str, timeout: float = 300) -> str:
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        if needle in line:
            return "".join(seen)
    raise AssertionError(f"never saw {needle!r}:\n{''.join(seen)}")


def assert_nothing_half_done(project) -> None:
    """Every state record that claims success matches its outputs, and every store entry verifies."""
    from etforge.cache.entries import read_entry

    cache = project.root / "artifacts" / "cache"
    for entry in cache.glob("??/*"):
        read_entry(entry)  # raises on a missing manifest or a blob that does not match
    for record_file in (project.out / ".state").glob("*.json"):
        record = json.loads(record_file.read_text())
        if record["status"] != "ok":
            continue
        for meta in record["outputs"].values():
            path = in_project(project, meta["path"])
            assert path.stat().st_size == meta["size"], path


def in_project(project, recorded: str) -> Path:
    """A path a record names, in ``project``: records keep absolute paths, and a copied project's
    untouched records still name the original's files."""
    parts = Path(recorded).parts
    return project.root.joinpath(*parts[len(parts) - 1 - parts[::-1].index("artifacts") :])


def flip_a_byte_inside_a_row(db: Path, task: str = "export:linreg/portable/fp32") -> None:
    """One byte of a task's JSON row changed in the file itself: SQLite's own check still passes."""
    data = bytearray(db.read_bytes())
    at = data.index(b'{"', data.index(task.encode()))  # its task_data follows its id
    data[at] = ord("}")
    db.write_bytes(bytes(data))
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA quick_check").fetchone()[0] == "ok"


def damage_database(db: Path, damage: str, task: str = "export:linreg/portable/fp32") -> None:
    if damage == "truncate":  # what a kill or a full disk did to the JSON database, in place
        with open(db, "r+b") as f:
            f.truncate(db.stat().st_size // 2)
    elif damage == "garbage":
        db.write_text('{"export:linreg/portable/fp32": {"_values_:')
    elif damage == "row":
        flip_a_byte_inside_a_row(db, task)
    elif damage == "directory":
        db.unlink()
        (db / "x").mkdir(parents=True)
    elif damage == "schema":
        db.unlink()
        with sqlite3.connect(db) as conn:
            conn.execute("CREATE TABLE doit (name TEXT, value INTEGER)")
    else:
        db.unlink()


DATABASE_DAMAGE = {
    "truncate": "database disk image is malformed",
    "garbage": "file is not a database",
    "row": "the row of 'export:linreg/portable/fp32' is not a JSON object: JSONDecodeError",
    "directory": "not a file",
    "schema": "its doit table has columns [('name', 'text'), ('value', 'integer')], not "
    "[('task_id', 'text'), ('task_data', 'json')]",
}
