"""etforge: pipeline.yaml -> ExecuTorch programs, as incremental doit tasks.

    doit                      build and validate every cell
    doit export               build every cell
    doit export model=linreg backend=xnnpack quant=fp32   a sub-matrix
    doit 'export:linreg/*'    the same by task-name pattern
    doit pipeline=other.yaml  another pipeline file (or $ETFORGE_PIPELINE)

torch and executorch are imported only inside task actions, so loading this
file and deciding that nothing changed stays fast. Loading it also installs
etforge's doit runners (tasks/doit_runner.py): the run lock, cleanup after
killed runs, worker-death handling and the exit status, whatever the reporter.
"""

from doit import get_initial_workdir, get_var

from tasks.engine import doit_runner
from tasks.engine import taskdicts as doit_tasks
from tasks.engine.entry import doit_config, load_selection, run_lifecycle

SELECTION = load_selection(get_var, get_initial_workdir())
LIFECYCLE = run_lifecycle(SELECTION)
doit_runner.install(LIFECYCLE)
DOIT_CONFIG = doit_config(SELECTION, LIFECYCLE)


def task_capture():
    """torch.export each model once, shared by all of its cells"""
    yield from doit_tasks.capture_tasks(SELECTION.plan, SELECTION.cells, SELECTION.store)


def task_quantize():
    """quantize each model once per quantizer config, shared by its cells"""
    yield from doit_tasks.quantize_tasks(SELECTION.plan, SELECTION.cells, SELECTION.store)


def task_export():
    """lower each cell (model x backend x quantization) to a .pte"""
    yield from doit_tasks.export_tasks(SELECTION.plan, SELECTION.cells, SELECTION.store)


def task_sizegate():
    """check each quantized .pte is smaller than its fp32 sibling"""
    yield from doit_tasks.size_gate_tasks(SELECTION.plan, SELECTION.cells, SELECTION.store)


def task_validate():
    """run each host-runnable .pte and compare it with eager PyTorch"""
    yield from doit_tasks.validate_tasks(SELECTION.plan, SELECTION.cells, SELECTION.store)


def task_benchmark():
    """time each host-runnable .pte (run with -n 1 for comparable figures)"""
    yield from doit_tasks.benchmark_tasks(SELECTION.plan, SELECTION.cells, SELECTION.store, SELECTION.host)


def task_report():
    """write the self-contained HTML report of the selected cells"""
    from tasks.publish.report.page import report_task

    yield report_task(SELECTION.plan, SELECTION.cells, SELECTION.store, SELECTION.host)


def task_release():
    """pack artifacts/release/<name>-<version>.tar.gz (allow_failures=1 packs despite failed cells,
    strict=1 refuses provisional ones)"""
    from tasks.publish.release import release_task

    yield release_task(SELECTION.plan, SELECTION.cells, SELECTION.host, get_var("allow_failures", "0") == "1",
                       strict=get_var("strict", "0") == "1")


def task_manifest():
    """write Dart, pubspec, CMake and JSON manifests of the built cells"""
    from tasks.publish.manifests.context import manifest_task  # appended on its own; the import stays local

    yield manifest_task(SELECTION.plan, SELECTION.cells, SELECTION.store, SELECTION.host)
