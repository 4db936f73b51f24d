"""``etforge repro CELL``: a standalone script that rebuilds a built cell with plain torch, torchao and
ExecuTorch calls and prints the figure its verdict was made of (docs/repro.md).

    $ etforge repro cnn/xnnpack/int8
    artifacts/t/repro/cnn_xnnpack_int8/repro.py (and artifacts/t/repro/cnn_xnnpack_int8/inputs.npz): run `python ...`

This command finds the cell and its current capture and verdict; the writer
(etforge.builders.repro.write, reached by its dotted path: app never imports builders) imports torch.
"""

from __future__ import annotations

from doit.cmd_base import Command

from etforge.app.loader import SELECTION_OPTIONS, request_from
from etforge.cache.records import current
from etforge.core.console import say
from etforge.core.dotted_path import load_callable
from etforge.core.errors import EtforgeError
from etforge.core.text import first_line, one_line
from etforge.engine.entry import load_selection

WRITER = "etforge.builders.repro.write:write_repro"
COVER = "etforge.builders.repro.cover:refusal"


class Repro(Command):
    doc_purpose = (
        "write a standalone script (plain torch/torchao/ExecuTorch) that rebuilds a cell and prints its figure"
    )
    doc_usage = "CELL"
    doc_description = (
        "Writes artifacts/<pipeline>/repro/<cell>/repro.py and inputs.npz: the cell's program rebuilt from "
        "its capture with etforge's options written out, run in the ExecuTorch runtime, SQNR per output "
        "against eager PyTorch. The cell must have been built (etforge validate:<cell>). Exit 3 on bad input."
    )
    cmd_options = SELECTION_OPTIONS

    def execute(self, params, args):
        if len(args) != 1:
            say("etforge: error: repro takes one cell: etforge repro <model>/<backend>/<quantization>")
            return 3
        request, _ = request_from(params)
        selection = load_selection(request)
        name = args[0]
        cell = next((c for c in selection.cells if c.name == name), None)
        if cell is None:
            say(
                f"etforge: error: repro: no cell named {one_line(repr(name), 80)} in this selection; `etforge list` lists them"
            )
            return 3
        why = load_callable(COVER)(cell)
        if why:
            say(f"etforge: error: {why}")
            return 3
        capture = selection.specs.get(f"capture:{cell.model.name}")
        validate = selection.specs.get(f"validate:{cell.name}")
        hit = selection.store.get(capture.store_key) if capture is not None else None
        numerics = selection.layout.numerics_path(cell)
        if hit is None or validate is None or not numerics.is_file():
            say(f"etforge: error: {cell.name} has not been built: run `etforge validate:{cell.name}` first")
            return 3
        if not current(validate):  # e.g. etforge's own code changed since: the figure is the last verdict's
            say(
                f"etforge: warning: {cell.name}'s verdict is older than its current key: `etforge validate:{cell.name}`"
            )
        files, _ = hit
        out = selection.layout.out_dir / "repro" / cell.stem
        try:
            script = load_callable(WRITER)(
                cell,
                selection.plan.root,
                selection.plan.seed,
                files["model.pt2"],
                files["reference.npz"],
                numerics,
                out,
            )
        except EtforgeError as exc:  # doit's command runner would print a traceback
            say(f"etforge: error: {first_line(exc)}")
            return exc.exit_code
        shown = script.relative_to(selection.plan.root) if script.is_relative_to(selection.plan.root) else script
        print(f"{shown} (and {shown.parent / 'inputs.npz'}): run `python {shown}`")
        return 0
