"""A model's ``outputs:`` selection: the program returns only the outputs the app consumes.

YOLO in eval mode returns its decoded predictions and three intermediate feature maps; RAFT
every refinement; DETR four tensors of which apps read two. ``outputs: ["[0]"]`` wraps the
built model before it is captured (and before a torchao scheme quantizes it), so that:

- the exported program returns only those, in the order given (a branch only the dropped
  outputs need is dead code, removed when the program is lowered);
- the eager reference holds only those, so only those are validated;
- the capture names them by their original key paths, so the manifests list only those,
  named as before.

The wrapper goes around the module handed to torch.export (the capture's, and a torchao or
dtype scheme's quantized model's), never around the model the schemes walk, so layer names
(keep_float, the quantize record) stay the model's own.

A selection item is a pytree key path as etforge names outputs (``"[0]"``, ``"['logits']"``),
the same without brackets and quotes (``logits``, ``1.0``), or an index into the flattened
outputs. One that matches no output fails the capture, naming the model's outputs.
"""

from __future__ import annotations

from etforge.core.errors import BadValue

CORE = "core"  # the wrapped model's attribute: its layers' names in the captured graph start with "core."


def _plain(path: str) -> str:
    """``[1]['boxes']`` -> ``1.boxes``: a key path without brackets and quotes."""
    return ".".join(part.strip("'\"") for part in path.replace("]", "").split("[") if part)


def resolve(selection, names: list) -> list:
    """Indices into ``names`` (the flattened outputs' key paths) of each item of ``selection``."""
    out = []
    for item in selection:
        if isinstance(item, int) and not isinstance(item, bool):
            if not 0 <= item < len(names):
                raise BadValue(
                    f"outputs: index {item} is out of range; the model has {len(names)} outputs: {', '.join(names)}"
                )
            out.append(item)
            continue
        found = [i for i, name in enumerate(names) if item in (name, _plain(name))]
        if not found:
            raise BadValue(f"outputs: no output {item!r}; the model's outputs are {', '.join(names) or 'none'}")
        out.append(found[0])
    return out


def select_outputs(model, selection):
    """``model`` returning only the selected outputs (a tuple), or ``model`` itself without a selection.

    The wrapper's ``output_names`` (after a call) are the selected outputs' original key paths."""
    if not selection:
        return model
    import torch
    from torch.utils import _pytree as pytree

    class SelectedOutputs(torch.nn.Module):
        def __init__(self, core, chosen):
            super().__init__()
            self.core = core  # (CORE: the captured graph names its layers core.<name>)
            self.chosen = tuple(chosen)
            self.output_names: list = []

        def forward(self, *args, **kwargs):
            leaves, _ = pytree.tree_flatten_with_path(self.core(*args, **kwargs))
            names = [pytree.keystr(path) for path, _ in leaves]
            picked = resolve(self.chosen, names)
            self.output_names = [names[i] for i in picked]
            return tuple(leaves[i][1] for i in picked)

    return SelectedOutputs(model, selection)


def selected_names(module) -> list | None:
    """The key paths of the outputs a wrapped module returned on its last call, else None."""
    names = getattr(module, "output_names", None) if type(module).__name__ == "SelectedOutputs" else None
    return list(names) if names else None
