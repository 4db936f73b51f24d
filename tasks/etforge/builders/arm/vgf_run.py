"""VGF programs run here: each VgfBackend delegate's own payload (the .vgf the model-converter
wrote) on Arm's ML SDK scenario runner, over the ML emulation layer for Vulkan on Mesa's
lavapipe (etforge.builders.arm.vgf_probe finds them; docs/vgf.md says how it was measured).

The ops outside the delegates run through etforge.builders.runtime.pte_interpreter, as a TOSA
program's do. What does not run is ExecuTorch's own VGF delegate (VGFBackend.cpp: not in the pip
runtime), which binds the same tensors to the same graph on a device.

The scenario runs in a child interpreter (a Vulkan driver must not be able to take the build
worker down), through the scenario runner's Python binding: the scenario is built once, which is
the slow part (its pipeline: about 5 s for a small int8 CNN here), then each sample is uploaded,
run and downloaded (about 2 ms). The Vulkan loader of Debian 12 (1.3.239) stacks explicit layers
in the order it finds their manifests, whatever VK_INSTANCE_LAYERS says; the Graph layer must sit
above the Tensor layer, so each manifest gets its own folder, the Graph one first.

Named by the arm_vgf recipe (``runtime.validated_by.runner``), called by the validate stage as
``runner(pte, samples, export_files)`` -> outputs per sample.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from etforge.builders.arm.vgf_probe import VgfStack, driver_env, find_stack
from etforge.builders.runtime.pte_interpreter import PteInterpreter
from etforge.core.errors import BuildError, Unsupported
from etforge.pipeline.results import Skip

LAYERS = ("VK_LAYER_ML_Graph_Emulation", "VK_LAYER_ML_Tensor_Emulation")  # top first
MANIFESTS = ("VkLayer_Graph.json", "VkLayer_Tensor.json")  # in explicit_layer.d, same order
# Tensor formats of a scenario template -> numpy dtype names.
FORMATS = {
    "VK_FORMAT_R8_BOOL_ARM": "bool",
    "VK_FORMAT_R8_SINT": "int8",
    "VK_FORMAT_R8_UINT": "uint8",
    "VK_FORMAT_R16_SINT": "int16",
    "VK_FORMAT_R16_UINT": "uint16",
    "VK_FORMAT_R32_SINT": "int32",
    "VK_FORMAT_R32_UINT": "uint32",
    "VK_FORMAT_R64_SINT": "int64",
    "VK_FORMAT_R16_SFLOAT": "float16",
    "VK_FORMAT_R32_SFLOAT": "float32",
}
INPUT, OUTPUT = "TEMPLATE_PATH_TENSOR_INPUT_", "TEMPLATE_PATH_TENSOR_OUTPUT_"  # vgf_dump's placeholders
TIMEOUT_S = 600


def vgf_program(pte: Path, samples: list, export_files: dict, method: str = "forward") -> list:
    """A VGF program's outputs (numpy arrays) per sample; Skip, naming what is missing, when this
    host cannot run it (etforge.builders.arm.vgf_probe)."""
    stack, missing = find_stack()
    if stack is None:
        raise Skip("VGF program not run here, missing: " + "; ".join(missing))
    with tempfile.TemporaryDirectory(prefix="etforge-vgf-") as work:
        interpreter = VgfInterpreter(Path(pte).read_bytes(), stack, Path(work), method)
        outputs = interpreter.run_all([list(inputs) for inputs in samples])
    return [[o.detach().numpy() for o in sample] for sample in outputs]


class VgfInterpreter(PteInterpreter):
    """A .pte's method over all samples at once, instruction by instruction: each kernel per sample,
    each VGF delegate for every sample in one scenario run."""

    def __init__(self, pte: bytes, stack: VgfStack, work: Path, method: str = "forward"):
        super().__init__(pte, self._no_tosa, method)
        self.stack = stack
        self.work = work

    @staticmethod
    def _no_tosa(backend_id: str, payload: bytes) -> bytes:
        raise Unsupported(f"a {backend_id} delegate in a VGF program")

    def run_all(self, samples: list) -> list:
        """The method's outputs (torch tensors) for each sample (a list of torch tensors)."""
        from executorch.exir import schema

        envs = [{i: x.contiguous() for i, x in zip(self.plan.inputs, inputs)} for inputs in samples]
        for instruction in self.plan.chains[0].instructions:
            args = instruction.instr_args
            if isinstance(args, schema.KernelCall):
                for env in envs:
                    self._kernel(args, env)
            elif isinstance(args, schema.DelegateCall):
                self._vgf_delegate(args, envs)
            else:
                raise Unsupported(f"instruction {type(args).__name__} is not interpreted")
        return [[env[i] for i in self.plan.outputs] for env in envs]

    def _vgf_delegate(self, call, envs: list) -> None:
        import numpy as np

        entry = self.plan.delegates[call.delegate_index]
        if entry.id != "VgfBackend":
            raise Unsupported(f"a {entry.id} delegate in a VGF program")
        payload = bytes(self.program.backend_delegate_data[entry.processed.index].data)
        folder = self.work / f"delegate{call.delegate_index}"
        folder.mkdir()
        template = scenario_template(self.stack, payload, folder)
        inputs, outputs = tensor_slots(template)
        if len(call.args) != len(inputs) + len(outputs):
            raise Unsupported(
                f"the VGF delegate takes {len(call.args)} values; its graph has {len(inputs)} inputs "
                f"and {len(outputs)} outputs"
            )
        batches = []
        for env in envs:
            given = []
            for index, (dims, dtype) in zip(call.args, inputs):
                array = np.ascontiguousarray(self._stored(index, env).detach().numpy())
                if list(array.shape) != dims or array.dtype != np.dtype(dtype):
                    raise BuildError(f"a VGF input is {array.dtype}{list(array.shape)}, its graph takes {dtype}{dims}")
                given.append(array)
            batches.append(given)
        results = run_scenario(self.stack, template, batches, folder)
        for env, found in zip(envs, results):
            for index, y in zip(call.args[len(inputs) :], found):
                env[index] = self._logical(index, y)
        self.trace.append(f"delegate:{entry.id}")


def scenario_template(stack: VgfStack, payload: bytes, folder: Path) -> dict:
    """vgf_dump's scenario template of a .vgf (its graph, tensors with dims and formats, dispatches),
    with the payload written to ``folder``/graph.vgf."""
    graph = folder / "graph.vgf"
    graph.write_bytes(payload)
    out = folder / "template.json"
    _run([str(stack.vgf_dump), "--input", str(graph), "--output", str(out), "--scenario-template"], "vgf_dump")
    template = json.loads(out.read_text(encoding="utf-8"))
    for resource in template["resources"]:
        if "graph" in resource:
            resource["graph"]["src"] = str(graph)
    return template


def tensor_slots(template: dict) -> tuple:
    """([(dims, dtype)] of the graph's inputs, the same of its outputs), in the placeholders' order."""
    inputs, outputs = {}, {}
    for resource in template["resources"]:
        tensor = resource.get("tensor")
        if tensor is None:
            continue
        fmt = tensor.get("format")
        if fmt not in FORMATS:
            raise Unsupported(f"a VGF tensor of format {fmt}")
        slot = ([int(d) for d in tensor["dims"]], FORMATS[fmt])
        if str(tensor.get("src", "")).startswith(INPUT):
            inputs[int(tensor["src"][len(INPUT) :])] = slot
        elif str(tensor.get("dst", "")).startswith(OUTPUT):
            outputs[int(tensor["dst"][len(OUTPUT) :])] = slot
    return [inputs[i] for i in sorted(inputs)], [outputs[i] for i in sorted(outputs)]


def run_scenario(stack: VgfStack, template: dict, batches: list, folder: Path) -> list:
    """The graph's outputs (numpy arrays) for each batch of inputs, from a child interpreter that
    builds the scenario once and runs it per batch (:func:`_child`)."""
    import numpy as np

    slots: dict = {"inputs": {}, "outputs": {}}  # placeholder index -> tensor uid
    for resource in template["resources"]:
        body = resource.get("tensor") or {}
        for kind, key, prefix, name in (("inputs", "src", INPUT, "in"), ("outputs", "dst", OUTPUT, "out")):
            if str(body.get(key, "")).startswith(prefix):
                index = int(body[key][len(prefix) :])
                slots[kind][index] = body["uid"]
                body[key] = str(folder / f"{name}{index}.npy")
                if kind == "inputs":  # the scenario loads these once; each batch is uploaded over them
                    np.save(body[key], batches[0][index])
    (folder / "scenario.json").write_text(json.dumps(template, indent=1), encoding="utf-8")
    listed = {kind: [uids[i] for i in sorted(uids)] for kind, uids in slots.items()}
    (folder / "slots.json").write_text(json.dumps({**listed, "count": len(batches)}), encoding="utf-8")
    np.savez(
        folder / "inputs.npz", **{f"s{n}_i{i}": x for n, arrays in enumerate(batches) for i, x in enumerate(arrays)}
    )
    command = [sys.executable, "-m", "etforge.builders.arm.vgf_run", str(folder)]
    _run(command, "the VGF scenario", env=layer_env(stack, folder))
    with np.load(folder / "outputs.npz") as found:
        return [[found[f"s{n}_o{j}"] for j in range(len(slots["outputs"]))] for n in range(len(batches))]


def layer_env(stack: VgfStack, folder: Path) -> dict:
    """The scenario runner's environment: lavapipe as the only driver, the Graph layer above the
    Tensor layer (one manifest folder each, the Graph one first: see the module docstring)."""
    source = stack.layers / "share" / "vulkan" / "explicit_layer.d"
    folders = []
    for rank, manifest in enumerate(MANIFESTS):
        target = folder / "layers" / str(rank)
        target.mkdir(parents=True, exist_ok=True)
        data = json.loads((source / manifest).read_text(encoding="utf-8"))
        data["layer"]["library_path"] = str(stack.layers / "lib" / data["layer"]["library_path"])
        (target / manifest).write_text(json.dumps(data), encoding="utf-8")
        folders.append(str(target))
    env = driver_env(stack.icd)
    env.update(VK_LAYER_PATH=":".join(folders), VK_INSTANCE_LAYERS=":".join(LAYERS))
    return env


def _run(command: list, tool: str, env: dict | None = None) -> None:
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired:
        raise BuildError(f"{tool} took over {TIMEOUT_S} s") from None
    if proc.returncode != 0:
        lines = (proc.stdout + proc.stderr).strip().splitlines()
        # the first error is the cause (a layer's "requires extension" before the device failure)
        errors = [line for line in lines if "ERROR" in line or "[Error]" in line] or lines[-1:] or ["no output"]
        raise BuildError(f"{tool} failed (exit {proc.returncode}): {errors[0].strip()}")


def _child(folder: Path) -> None:
    """In the child: load ``folder``/scenario.json once (pipeline creation is the slow part, about
    5 s for a small int8 CNN), then upload each batch's inputs, run, download its outputs."""
    import numpy as np
    import scenario_runner_py  # type: ignore[import-not-found]  # a binary module, no stubs

    slots = json.loads((folder / "slots.json").read_text(encoding="utf-8"))
    scenario = scenario_runner_py.load_scenario(folder / "scenario.json", work_dir=folder, output_dir=folder)
    inputs = [scenario.get_tensor_id(uid) for uid in slots["inputs"]]
    outputs = [scenario.get_tensor_id(uid) for uid in slots["outputs"]]
    found = {}
    with np.load(folder / "inputs.npz") as given:
        for n in range(slots["count"]):
            for i, tensor in enumerate(inputs):
                scenario.upload(tensor, np.ascontiguousarray(given[f"s{n}_i{i}"]))
            scenario.run()
            for j, tensor in enumerate(outputs):
                found[f"s{n}_o{j}"] = np.array(scenario.download(tensor))
    np.savez(folder / "outputs.npz", **found)


if __name__ == "__main__":
    _child(Path(sys.argv[1]))
