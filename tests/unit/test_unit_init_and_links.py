"""Writes that stay where they belong: ``etforge init`` never writes through a symlink that dangles
or leaves its directory, and a run never writes through a link at any depth of ``artifacts/``
that dangles or leaves the project (issue 30, items 8 and 12). Each refusal is one line."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

import pytest

from etforge.app.cli import main
from unit import fake_builders
from unit.support import PIPELINE

# ---------------------------------------------------------------- etforge init


def init(capfd, target: Path) -> tuple[int, str, str]:
    """``etforge init TARGET`` in this process: (exit status, stdout, stderr)."""
    capfd.readouterr()
    code = main(["init", str(target)])
    out, err = capfd.readouterr()
    return code, out, err


def files_under(directory: Path) -> list:
    return sorted(p.relative_to(directory).as_posix() for p in directory.rglob("*"))


def test_init_does_not_create_the_target_of_a_dangling_pipeline_yaml(tmp_path, capfd):
    project, gone = tmp_path / "app", tmp_path / "elsewhere.yaml"
    project.mkdir()
    (project / "pipeline.yaml").symlink_to(gone)
    code, out, err = init(capfd, project)
    assert (code, out) == (3, "")
    assert err == (
        f"etforge: error: {project / 'pipeline.yaml'} is a symlink to {gone}, which does not exist: "
        "init does not write through it\n"
    )
    assert not gone.exists() and files_under(project) == ["pipeline.yaml"]  # nothing written


def test_init_does_not_write_into_a_models_link_out_of_its_directory(tmp_path, capfd):
    project, outside = tmp_path / "app", tmp_path / "outside"
    project.mkdir()
    outside.mkdir()
    (project / "models").symlink_to(outside)
    code, out, err = init(capfd, project)
    assert (code, out) == (3, "")
    assert err == (
        f"etforge: error: {project / 'models'} is a symlink to {outside}, outside the project directory "
        f"{project}: init does not write through it\n"
    )
    assert list(outside.iterdir()) == [] and files_under(project) == ["models"]


def test_init_names_a_dangling_models_link(tmp_path, capfd):
    project = tmp_path / "app"
    project.mkdir()
    (project / "models").symlink_to(tmp_path / "gone")
    code, _, err = init(capfd, project)
    assert code == 3
    assert err == (
        f"etforge: error: {project / 'models'} is a symlink to {tmp_path / 'gone'}, which does not exist: "
        "init does not write through it\n"
    )
    assert not (tmp_path / "gone").exists()


def test_init_follows_a_models_link_within_its_directory(tmp_path, capfd):
    project = tmp_path / "app"
    (project / "src" / "models").mkdir(parents=True)
    (project / "models").symlink_to(Path("src") / "models")
    code, _, err = init(capfd, project)
    assert (code, err) == (0, "")
    assert files_under(project / "src" / "models") == ["__init__.py", "tiny_classifier.py"]


@pytest.mark.parametrize(
    "case, message",
    [
        ("models-is-a-file", "{project}/models is not a directory: move it aside to scaffold the project"),
        ("target-is-a-file", "{project} is not a directory"),
        ("target-dangles", "{project} is a symlink to {gone}, which does not exist: init does not write through it"),
    ],
)
def test_init_says_what_is_in_the_way_on_one_line(tmp_path, capfd, case, message):
    project, gone = tmp_path / "app", tmp_path / "gone"
    if case == "models-is-a-file":
        project.mkdir()
        (project / "models").write_text("mine\n")
    elif case == "target-is-a-file":
        project.write_text("mine\n")
    else:
        project.symlink_to(gone)
    code, out, err = init(capfd, project)
    assert (code, out) == (3, "")
    assert err == "etforge: error: " + message.format(project=project, gone=gone) + "\n"
    assert not gone.exists()
    if case == "models-is-a-file":
        assert files_under(project) == ["models"] and (project / "models").read_text() == "mine\n"


def test_init_keeps_existing_files_even_through_links(tmp_path, capfd):
    project, shared = tmp_path / "app", tmp_path / "shared.yaml"
    project.mkdir()
    shared.write_text("mine\n")
    (project / "pipeline.yaml").symlink_to(shared)  # an existing file, wherever it is: kept
    (project / ".gitignore").write_text("own\n")
    code, out, err = init(capfd, project)
    assert (code, err) == (0, "")
    assert f"kept    {project / 'pipeline.yaml'} (already there)" in out.splitlines()
    assert shared.read_text() == "mine\n" and (project / ".gitignore").read_text() == "own\n"
    assert (project / "models" / "tiny_classifier.py").is_file()


@contextlib.contextmanager
def file_modes_enforced():
    """Root ignores a directory's mode: as root, act as nobody meanwhile (the real uid stays root,
    so the effective one comes back)."""
    if os.geteuid() != 0:
        yield
        return
    os.setegid(65534)
    os.seteuid(65534)
    try:
        yield
    finally:
        os.seteuid(0)
        os.setegid(0)


def test_init_in_a_read_only_directory_is_one_line(tmp_path, capfd):
    assert init(capfd, tmp_path / "warm")[0] == 0  # what init imports is imported now, as root
    # a directory anyone can reach (pytest's are private to their owner), made read-only
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o755)
        locked = Path(tmp) / "locked"
        locked.mkdir()
        locked.chmod(0o555)
        with file_modes_enforced():
            code, out, err = init(capfd, locked)
        assert (code, out) == (3, "")
        assert err == f"etforge: error: cannot write {locked / 'pipeline.yaml'}: Permission denied\n"
        assert list(locked.iterdir()) == []


# ---------------------------------------------------------------- links under artifacts/


def run(capfd, *args: str) -> tuple[int, str]:
    """``etforge ARGS`` with the fake builders, in this process (the project's directory): (exit status, stderr)."""
    capfd.readouterr()
    try:
        code = main(["-o", "run.out", *args], fake_builders.TABLE)
    except SystemExit as exc:  # an error before any task runs: one line, exit 3
        code = exc.code
    return code, capfd.readouterr().err


@pytest.fixture
def project(unit_project, monkeypatch):
    monkeypatch.chdir(unit_project.root)
    return unit_project


def link(project, where: str, to: Path) -> Path:
    path = project.root / where
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(to)
    return path


# Where a link wedged or escaped a run: deep in artifacts/, where the check did not look.
DEEP = [
    "artifacts/t/.state/keys",  # each key's inputs: validate made it, and failed with FileExistsError
    "artifacts/t/.state",
    "artifacts/t/logs",
    "artifacts/t/a",
    "artifacts/cache/locks",
    "artifacts/cache/tmp",
    "artifacts/release/t-0.0.1",
    "artifacts/t/manifests/sub",
]


@pytest.mark.parametrize("where", DEEP)
def test_a_dangling_link_anywhere_in_artifacts_is_named_before_any_task_runs(project, capfd, tmp_path, where):
    path = link(project, where, tmp_path / "gone")
    code, err = run(capfd, "validate")
    assert code == 3
    assert err == (
        f"etforge: error: {path} is a symlink to {tmp_path / 'gone'}, which does not exist: "
        "create that directory or remove the link\n"
    )
    assert fake_builders.calls(project.root) == [] and not (tmp_path / "gone").exists()


@pytest.mark.parametrize("where", DEEP + ["artifacts/.etforge/pending-uploads"])
def test_a_link_out_of_the_project_at_any_depth_is_refused_and_nothing_is_written_there(
    project, capfd, tmp_path, where
):
    outside = tmp_path / "outside"
    outside.mkdir()
    path = link(project, where, outside)
    code, err = run(capfd, "validate")
    assert code == 3
    assert err == (
        f"etforge: error: {path} is a symlink to {outside}, outside the project directory {project.root}: "
        "etforge does not write through it (set `artifacts: {allow_outside: true}` in pipeline.yaml to follow it)\n"
    )
    assert list(outside.iterdir()) == [] and fake_builders.calls(project.root) == []


def test_a_file_link_out_of_the_project_is_refused_too(project, capfd, tmp_path):
    # etforge appends to its bookkeeping files in place (open "a"): that follows a link
    outside = tmp_path / "notes.txt"
    outside.write_text("mine\n")
    path = link(project, "artifacts/.etforge/remote-down", outside)
    code, err = run(capfd, "validate")
    assert code == 3 and f"etforge: error: {path} is a symlink to {outside}, outside the project directory" in err
    assert outside.read_text() == "mine\n"


def test_a_link_out_of_the_project_is_followed_when_the_pipeline_allows_it(project, capfd, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    project.write_pipeline(PIPELINE + "artifacts: {allow_outside: true}\n")
    link(project, "artifacts/t/.state/keys", outside)
    code, err = run(capfd, "validate")
    assert (code, err) == (0, "")
    assert list(outside.iterdir())  # the keys' inputs went where the link says


def test_a_link_within_the_project_is_followed_and_what_it_leads_to_is_checked(project, capfd, tmp_path):
    kept = project.root / "kept"
    kept.mkdir()
    link(project, "artifacts/t/.state", kept)
    code, err = run(capfd, "validate")
    assert (code, err) == (0, "")
    assert (kept / "keys").is_dir() and (kept / "validate__a__xnnpack__fp32.json").is_file()
    (kept / "keys").rename(kept / "moved")
    (kept / "keys").symlink_to(tmp_path / "gone")  # reached only through the link
    code, err = run(capfd, "validate")
    assert code == 3
    assert err.startswith(f"etforge: error: {project.root / 'artifacts/t/.state/keys'} is a symlink to ")


def test_a_link_back_up_the_tree_ends_the_walk(project, capfd, tmp_path):
    (tmp_path / "python").mkdir()
    link(project, ".venv", tmp_path / "python")  # the project's own business: not under artifacts/
    link(project, "artifacts/t/loop", project.root / "artifacts")  # no loop
    link(project, "artifacts/t/up", project.root)  # nor a walk of the whole project
    code, err = run(capfd, "export")
    assert (code, err) == (0, "")
