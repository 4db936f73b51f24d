"""Byte-reproducible Core ML delegate blobs.

ExecuTorch's Core ML backend hands the runtime a *flattened directory*:
``lowered_module/{metadata.json, debug_info.json, model.mlpackage/...}``
packed by ``executorchcoreml.flatten_directory_contents``. Four things make
those bytes differ between two lowerings of the same graph (measured with
executorch 1.5.1 and coremltools 9.0 by diffing two unflattened blobs):

1. ``metadata.json`` ``identifier``: ``CoreMLBackend.preprocess_model``
   (executorch/backends/apple/coreml/compiler/coreml_preprocess.py) stamps
   ``"executorch_" + str(uuid.uuid4())``.
2. ``model.mlpackage/Manifest.json``: coremltools' package writer keys each
   item (the spec, the weights directory) by a random UUID, and
   ``rootModelIdentifier`` names one of them.
3. ``model.mlmodel``: the protobuf serializer writes map fields (op inputs,
   attributes, user metadata) in hash-table order, which changes from process
   to process; and ``ct.convert`` records ``conversion_date`` (today's date)
   in the user metadata, so a build on another day differs.
4. The flattened layout: the packer lists each directory in ``readdir`` order
   through a ``std::unordered_map``, so the entry order depends on the file
   system the temp dir lives on.

``deterministic_lowering()`` wraps ``CoreMLBackend.preprocess_model`` (the
function that stamps the uuid) for the duration of one lowering, and rewrites
its output: the spec is re-serialized deterministically without the date, the
manifest's item UUIDs become name-based UUIDs of the item's path and content
(references kept consistent), the identifier becomes a name-based UUID of the
whole blob's content, and the directory is packed again with entries in
sorted order. Upstream's own temp dir (named after its random uuid) is left
alone, and ours is a fresh ``mkdtemp``, so concurrent workers lowering the
same content never share a path.

Why the identifier must cover *everything*: on device the Core ML delegate
caches compiled models by this identifier (ETCoreMLModelManager
``assetWithIdentifier``). Equal identifiers must therefore mean equal models,
which a digest of every file in the blob guarantees; a digest of less (the
spec without the weights, say) would make a re-exported model with new
weights load a stale compiled model.

Not covered: multi-method programs (``CoreMLBackend.preprocess_multimethod``
stamps its own uuid into a NamedDataStore key); etforge exports one method
per program and never reaches it. ``model_type=COMPILED_MODEL`` needs macOS to
compile and is not used either.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
import uuid
from contextlib import contextmanager
from pathlib import Path

from etforge.core.errors import BuildError

# Name-based (uuid5) UUIDs live in this namespace: uuid5(NAMESPACE_URL, "https://etforge/coreml").
NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "https://etforge/coreml")
CONVERSION_DATE_KEY = "com.github.apple.coremltools.conversion_date"
METADATA = "metadata.json"
MANIFEST = "Manifest.json"
FILE_KIND, DIRECTORY_KIND = 0, 1  # inmemoryfs InMemoryNode::Kind


@contextmanager
def deterministic_lowering():
    """While active, every Core ML partition lowered in this process gets reproducible bytes.

    Wraps ``CoreMLBackend.preprocess_model`` (coreml_preprocess.py, executorch
    1.5.1), the step that saves the converted model, stamps the uuid and packs
    the directory; ``CoreMLBackend.preprocess`` calls it for each partition.
    Upstream runs unchanged (its own temp dir stays unique per call); only its
    ``processed_bytes`` are replaced by ``canonical_blob`` of them. Restored on
    exit, also on error; per process (doit workers are processes)."""
    from executorch.backends.apple.coreml.compiler.coreml_preprocess import CoreMLBackend

    original = CoreMLBackend.__dict__["preprocess_model"]  # the staticmethod object itself

    def preprocess_model(mlmodel, model_type):
        result = original.__func__(mlmodel, model_type=model_type)
        result.processed_bytes = canonical_blob(result.processed_bytes)
        return result

    CoreMLBackend.preprocess_model = staticmethod(preprocess_model)
    try:
        yield
    finally:
        CoreMLBackend.preprocess_model = original


def canonical_blob(blob: bytes) -> bytes:
    """The same delegate blob with every random or time-dependent byte replaced by content-derived ones."""
    with tempfile.TemporaryDirectory(prefix="etforge-coreml-") as tmp:  # private: workers never share it
        root = read_blob(blob, Path(tmp) / "in")
        for package in sorted(root.glob("*.mlpackage")):
            _normalize_spec(package)
            _rename_manifest_items(package)
        _stamp_identifier(root)
        check_model(root)
        out = flatten(root)
        _check_round_trip(out, root, Path(tmp) / "check")
    return out


def read_blob(blob: bytes, into: Path) -> Path:
    """Unpack a delegate blob under ``into``; returns its root directory (``lowered_module``)."""
    from executorch.backends.apple.coreml import executorchcoreml

    into.mkdir(parents=True, exist_ok=True)
    executorchcoreml.unflatten_directory_contents(blob, str(into))
    (root,) = into.iterdir()
    return root


def check_model(root: Path) -> None:
    """Open each mlpackage of an unpacked blob with coremltools (which reads its Manifest.json and
    spec) and check that the metadata's input/output names are the model's; raise if not."""
    import coremltools as ct

    metadata = json.loads((root / METADATA).read_text(encoding="utf-8"))
    packages = sorted(root.glob("*.mlpackage"))
    if not packages:
        raise BuildError(f"Core ML blob holds no .mlpackage: {sorted(p.name for p in root.iterdir())}")
    for package in packages:
        description = ct.models.MLModel(str(package), skip_model_load=True).get_spec().description
        names = ([i.name for i in description.input], [o.name for o in description.output])
        if names != (metadata["inputNames"], metadata["outputNames"]):
            raise BuildError(
                f"Core ML model {package.name} has inputs/outputs {names}, "
                f"its metadata.json says {metadata['inputNames']}/{metadata['outputNames']}"
            )


# --------------------------------------------------------------------------- the rewrites


def _spec_path(package: Path) -> Path:
    manifest = json.loads((package / MANIFEST).read_text(encoding="utf-8"))
    root_item = manifest["itemInfoEntries"][manifest["rootModelIdentifier"]]
    return package / "Data" / root_item["path"]


def _normalize_spec(package: Path) -> None:
    """Re-serialize the Core ML spec with sorted map entries and no conversion date."""
    from coremltools.proto import Model_pb2

    path = _spec_path(package)
    spec = Model_pb2.Model()
    spec.ParseFromString(path.read_bytes())
    user_defined = spec.description.metadata.userDefined
    if CONVERSION_DATE_KEY in user_defined:
        del user_defined[CONVERSION_DATE_KEY]
    path.write_bytes(spec.SerializeToString(deterministic=True))


def _rename_manifest_items(package: Path) -> None:
    """Replace each item's random UUID by a uuid5 of its path and content; keep the root reference."""
    manifest_path = package / MANIFEST
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    renamed = {}
    for old, item in manifest["itemInfoEntries"].items():
        content = tree_digest(package / "Data" / item["path"])
        renamed[old] = str(uuid.uuid5(NAMESPACE, f"item:{item['path']}:{content}"))
    if len(set(renamed.values())) != len(renamed):
        raise BuildError(f"{manifest_path}: two items share a path; cannot name them by content")
    manifest["itemInfoEntries"] = {renamed[k]: v for k, v in manifest["itemInfoEntries"].items()}
    manifest["rootModelIdentifier"] = renamed[manifest["rootModelIdentifier"]]
    # The layout coremltools writes (4-space indent, sorted keys, trailing newline).
    manifest_path.write_text(json.dumps(manifest, indent=4, sort_keys=True) + "\n", encoding="utf-8")


def _stamp_identifier(root: Path) -> None:
    """identifier = executorch_<uuid5 of every other byte of the blob> (see the module doc for why all)."""
    path = root / METADATA
    metadata = json.loads(path.read_text(encoding="utf-8"))
    others = tree_digest(root, skip=(path,))
    names = json.dumps({k: v for k, v in metadata.items() if k != "identifier"}, sort_keys=True)
    metadata["identifier"] = "executorch_" + str(uuid.uuid5(NAMESPACE, f"model:{others}:{names}"))
    path.write_text(json.dumps(metadata), encoding="utf-8")  # upstream's layout: json.dumps(asdict(...))


def tree_digest(path: Path, skip: tuple = ()) -> str:
    """sha256 over the relative paths and bytes of a file or a directory tree, in sorted order."""
    h = hashlib.sha256()
    entries = (
        [path] if path.is_file() else sorted(path.rglob("*"), key=lambda p: p.relative_to(path).as_posix().encode())
    )
    for entry in entries:
        if entry in skip:
            continue
        name = entry.relative_to(path).as_posix() if entry != path else ""
        if entry.is_dir():
            h.update(f"{name}/\0".encode())
            continue
        data = entry.read_bytes()
        h.update(f"{name}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


# --------------------------------------------------------------------------- packing


def flatten(root: Path) -> bytes:
    """Pack ``root`` in executorchcoreml's flattened-directory format, children in sorted order.

    Mirrors inmemoryfs (backends/apple/coreml/runtime/inmemoryfs): file bytes
    back to back, then the node table as compact JSON with sorted keys,
    reversed byte for byte. Nodes are listed depth first, each directory after
    its children, and name their children by index. Upstream lists children in
    ``readdir`` order; sorting them is the only difference. ``canonical_blob``
    proves every result by unpacking it with upstream's own reader.
    """
    data = bytearray()
    nodes: list = []

    def visit(path: Path) -> int:
        if path.is_dir():
            children = {child.name: visit(child) for child in sorted(path.iterdir(), key=lambda p: p.name.encode())}
            nodes.append(
                {
                    "children": children,
                    "dataRegion": {"offset": 0, "size": 0},
                    "kind": DIRECTORY_KIND,
                    "name": path.name,
                }
            )
        else:
            content = path.read_bytes()
            nodes.append(
                {
                    "children": {},
                    "dataRegion": {"offset": len(data), "size": len(content)},
                    "kind": FILE_KIND,
                    "name": path.name,
                }
            )
            data.extend(content)
        return len(nodes) - 1

    visit(root)
    table = json.dumps({"nodes": nodes}, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return bytes(data) + table.encode("utf-8")[::-1]


def _check_round_trip(blob: bytes, expected: Path, scratch: Path) -> None:
    """Unpack ``blob`` with executorchcoreml's reader and demand exactly the tree it was packed from."""
    unpacked = read_blob(blob, scratch)
    if unpacked.name != expected.name or tree_digest(unpacked) != tree_digest(expected):
        raise BuildError(
            "the re-packed Core ML blob does not unpack to the tree it was packed from: "
            "executorchcoreml's flattened-directory format changed; update etforge's builders/coreml_reproducible.py"
        )
