"""etforge: pipeline.yaml -> ExecuTorch programs, as incremental doit tasks.

    doit                      build and validate every cell
    doit export               build every cell
    doit export model=linreg backend=xnnpack quant=fp32   a sub-matrix
    doit 'export:linreg/*'    the same by task-name pattern
    doit pipeline=other.yaml  another pipeline file (or $ETFORGE_PIPELINE)

The composition root: it resolves the pipeline (tasks/config), makes one doit
task creator per stage of the stage table (tasks/store/stages.py, through
tasks/engine), and wires publishing into the engine: the run lifecycle is
handed the exit status (tasks/publish/exit_status.py) and doit the progress
reporter (tasks/publish/progress.py), so the engine never imports publishing.
Loading it also installs etforge's doit runners (tasks/engine/doit_runner.py):
the run lock, cleanup after killed runs, worker-death handling and the exit
status, whatever the reporter.

torch and executorch are imported only inside task actions, so loading this
file and deciding that nothing changed stays fast.
"""

from doit import get_initial_workdir, get_var

from tasks.engine import doit_runner, entry
from tasks.engine.lifecycle import RunLifecycle
from tasks.publish.exit_status import ExitStatus
from tasks.publish.progress import make_reporter
from tasks.store.stages import STAGES

SELECTION = entry.load_selection(get_var, get_initial_workdir())
EXIT_STATUS = ExitStatus(SELECTION.plan, SELECTION.host, SELECTION.specs, SELECTION.cells_by_task)
LIFECYCLE = RunLifecycle(SELECTION.layout, SELECTION.specs, judge=EXIT_STATUS.decide)
doit_runner.install(LIFECYCLE)
DOIT_CONFIG = entry.doit_config(
    SELECTION, make_reporter(SELECTION.plan, SELECTION.specs, SELECTION.cells_by_task, SELECTION.host)
)

# One task creator per stage, in pipeline order: task_capture, task_quantize, task_export, ...
for _stage in STAGES:
    globals()[f"task_{_stage.name}"] = entry.task_creator(SELECTION, _stage, get_var)
