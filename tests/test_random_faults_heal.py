"""Randomized faults on a built project with a shared remote: each case draws a few faults from a
seeded generator (a kill at a random moment, damaged store entries, state records, doit rows,
working-tree outputs, hostile remote entries, damaged memos), then one run must heal everything
with exit status 0 and leave every output with the sha256 its record names (programs loadable),
``etforge diff`` against a hostile baseline (drawn too) must be one line and exit 2, a second run
must execute nothing, and a working tree restored from the store alone must be whole again.

``ETFORGE_FAULT_CASES`` cases run (default 2; ``make test-all`` runs 12), drawn from
``ETFORGE_FAULT_SEED`` (default 0): a failing case prints its seed and faults, to replay it.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import time

import pytest
from conftest import Project, copy_project, damage_database, in_project, make_project, start_doit, state
from test_hostile_remote_entries import HOSTILE_REMOTE_DAMAGES
from unit.test_unit_diff_hostile import HOSTILE_PROVENANCE

CASES = int(os.environ.get("ETFORGE_FAULT_CASES", "2"))
SEED = int(os.environ.get("ETFORGE_FAULT_SEED", "0"))

PIPELINE = """\
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
  portable: {}
quantization: [fp32]
targets: false
cache: {remote: ../remote}
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Project:
    """The pipeline built once, every entry uploaded to its file:// remote beside the project."""
    base = tmp_path_factory.mktemp("random-faults")
    (base / "remote").mkdir()
    project = make_project(base / "proj", PIPELINE)
    run = project.doit()  # one worker imports torch, not two (the cases draw their own -n 2 runs)
    assert run.returncode == 0, run.stdout + run.stderr
    return project


def entries(project: Project) -> list:
    return sorted((project.root / "artifacts" / "cache").glob("??/*"))


# Each fault: (project, rng) -> what it did, one line.


def flip_blob(project, rng) -> str:
    """(A flip that keeps the mtime is caught only by a reader: tests/test_faults_recover.py forces one.)"""
    entry = rng.choice(entries(project))
    blob = rng.choice([p for p in entry.iterdir() if p.name != "manifest.json"])
    data = bytearray(blob.read_bytes())
    data[rng.randrange(len(data))] ^= 0xFF
    blob.write_bytes(bytes(data))
    return f"flipped a byte of {entry.name[:12]}/{blob.name}"


def delete_from_entry(project, rng) -> str:
    entry = rng.choice(entries(project))
    victim = rng.choice(sorted(entry.iterdir()))
    victim.unlink()
    return f"deleted {entry.name[:12]}/{victim.name}"


def damage_record(project, rng) -> str:
    record = rng.choice(sorted((project.out / ".state").glob("*.json")))
    how = rng.choice(["truncate", "garbage", "other-key"])
    if how == "truncate":
        record.write_bytes(record.read_bytes()[: rng.randrange(1, 40)])
    elif how == "garbage":
        record.write_bytes(bytes(rng.randrange(256) for _ in range(64)))
    else:
        data = json.loads(record.read_text())
        data["key"] = "0" * 64
        record.write_text(json.dumps(data))
    return f"{how} state record {record.name}"


def damage_doit_database(project, rng) -> str:
    how = rng.choice(["truncate", "garbage", "row", "directory", "schema", "delete"])
    damage_database(project.root / "artifacts" / ".doit.sqlite3", how, task="export:cnn/portable/fp32")
    return f"doit database: {how}"


def delete_output(project, rng) -> str:
    output = rng.choice(sorted(p for p in project.out.glob("*/*") if p.is_file()))
    output.unlink()
    return f"deleted {output.relative_to(project.out)}"


def hostile_remote_entry(project, rng) -> str:
    """A remote entry made hostile, and the local copy gone, so that the next run must read it."""
    entry = rng.choice(entries(project))
    key = entry.name
    name = rng.choice(sorted(HOSTILE_REMOTE_DAMAGES))
    HOSTILE_REMOTE_DAMAGES[name](project.root.parent / "remote", key)
    shutil.rmtree(entry)
    return f"remote entry {key[:12]}: {name}"


def damage_memo(project, rng) -> str:
    """One of etforge's own memos damaged: a cache, so a miss (set aside with one warning)."""
    memo = project.root / "artifacts" / ".etforge" / rng.choice(["digests.json", "content-keys.json"])
    data = memo.read_bytes()
    how = rng.choice(["flip", "truncate", "deep", "garbage"])
    if how == "flip":  # one byte inside, e.g. of a kept parse of pipeline.yaml
        at = rng.randrange(len(data))
        memo.write_bytes(data[:at] + bytes([data[at] ^ 0x20]) + data[at + 1 :])
    elif how == "truncate":
        memo.write_bytes(data[: rng.randrange(len(data))])
    elif how == "deep":
        memo.write_text("[" * 100_000 + "]" * 100_000)
    else:
        memo.write_bytes(bytes(rng.randrange(256) for _ in range(64)))
    return f"{memo.name}: {how}"


FAULTS = (
    flip_blob,
    delete_from_entry,
    damage_record,
    damage_doit_database,
    delete_output,
    hostile_remote_entry,
    damage_memo,
)


def kill_mid_run(project, rng) -> str:
    """Force the cnn's export to run again, then SIGKILL the whole run at a random moment."""
    export = state(project, "export:cnn/portable/fp32")
    shutil.rmtree(project.root / "artifacts" / "cache" / export["key"][:2] / export["key"])
    (project.out / ".state" / "export__cnn__portable__fp32.json").unlink()
    (project.out / "cnn" / "cnn_portable_fp32.pte").unlink()
    delay = rng.uniform(0.5, 6.0)
    proc = start_doit(project, *rng.choice([(), ("-n", "2", "-P", "process")]))
    time.sleep(delay)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    return f"killed a run after {delay:.1f}s"


def diff_against_a_hostile_baseline(project: Project, rng, where) -> str:
    """``etforge diff`` against a release directory whose provenance.json is hostile (odd types,
    deep nesting, huge numbers, not JSON) or a FIFO: one line, exit 2, no hang."""
    release = where / "t-0.0.1"
    release.mkdir(parents=True)
    name = rng.choice(sorted(HOSTILE_PROVENANCE) + ["a FIFO"])
    if name == "a FIFO":
        os.mkfifo(release / "provenance.json")
    else:
        text = HOSTILE_PROVENANCE[name][0]
        (release / "provenance.json").write_bytes(text if isinstance(text, bytes) else text.encode())
    run = project.start_doit("diff", "--baseline", str(release)).finish(timeout=120)
    said = [line for line in run.stderr.splitlines() if not line.startswith("etforge: warning:")]
    assert run.returncode == 2 and len(said) == 1 and said[0].startswith("etforge: error:"), (name, run.stderr)
    return f"diff against a baseline with {name}: {said[0]}"


def outputs_match_their_records(project: Project) -> None:
    """Every working-tree output of a successful task has the sha256 its record names, and every
    .pte loads in the ExecuTorch runtime. (A damaged store entry that no task read this run may
    stay in the store: it is caught whenever it is read, never served.)"""
    import hashlib

    from executorch.runtime import Runtime

    for record_file in (project.out / ".state").glob("*.json"):
        record = json.loads(record_file.read_text())
        if record["status"] not in ("ok", "not-runnable"):
            continue
        for name, meta in record["outputs"].items():
            data = in_project(project, meta["path"]).read_bytes()
            assert hashlib.sha256(data).hexdigest() == meta["sha256"], f"{record_file.name}: {name}"
            if name == "program.pte":
                Runtime.get().load_program(data).load_method("forward")


@pytest.mark.parametrize("case", range(CASES))
def test_random_faults_heal_in_one_run_and_the_next_run_does_nothing(built, tmp_path, case):
    rng = random.Random(f"{SEED}-{case}")
    project = copy_project(built, tmp_path / "proj")
    shutil.copytree(built.root.parent / "remote", tmp_path / "remote", symlinks=True)
    done = [kill_mid_run(project, rng)] if rng.random() < 0.4 else []
    done += [fault(project, rng) for fault in rng.sample(FAULTS, rng.randint(1, 3))]
    replay = f"ETFORGE_FAULT_SEED={SEED} case {case}: " + "; ".join(done)
    print(replay)  # shown with -s, and on failure
    run = project.doit(*rng.choice([(), ("-n", "2", "-P", "process")]))
    assert run.returncode == 0, f"{replay}\n{run.stdout}{run.stderr}"
    assert "Traceback" not in run.stdout + run.stderr, replay
    outputs_match_their_records(project)
    print(diff_against_a_hostile_baseline(project, rng, tmp_path / "baseline"))
    again = project.doit()
    assert again.returncode == 0 and again.started == set(), f"{replay}\n{again.stdout}{again.stderr}"
    # Everything the store serves verifies: a working tree restored from it alone is whole.
    shutil.rmtree(project.out)
    restored = project.doit()
    assert restored.returncode == 0, f"{replay}\n{restored.stdout}{restored.stderr}"
    outputs_match_their_records(project)
