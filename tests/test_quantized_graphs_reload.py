"""A quantized graph lowers in a process that did not quantize it (another worker, a later run)."""

from conftest import make_project

PIPELINE = """\
name: t
version: 0.0.1
models:
  tt:
    python: models.tiny_transformer:build
    inputs: [{name: tokens, shape: [1, 16, 64]}]
backends:
  coreml: {}
quantization: [coreml_palette4]
"""


def test_a_palettized_graph_lowers_in_a_later_run(tmp_path):
    project = make_project(tmp_path / "proj", PIPELINE)
    quantized = project.doit("quantize")
    assert quantized.returncode == 0, quantized.stdout + quantized.stderr
    exported = project.doit("export:tt/coreml/coreml_palette4")
    assert exported.started == {"export:tt/coreml/coreml_palette4"}, exported.stdout
    assert exported.returncode == 0, exported.stdout + exported.stderr
    assert "ok               export:tt/coreml/coreml_palette4" in exported.stdout
