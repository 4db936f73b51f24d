"""Safe YAML loading that remembers the line of every key.

Only plain YAML is accepted (``yaml.SafeLoader`` resolution): tags that try to
construct Python objects, duplicate keys and alias bombs are errors naming
the line, not surprises later. The parsing itself is in config/yaml_parse.py, imported only
when a file is parsed (a no-op run takes pipeline.yaml and the recipes from the digest memo,
config/validation_memo.py).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from etforge.core.errors import PipelineError
from etforge.core.key_path import KeyPath, format_path

# A pipeline is a few hundred lines. Pure-Python PyYAML needs ~40 us per value,
# so this caps a hostile or mistaken file at a few seconds of parsing.
MAX_BYTES = 256 << 10


@dataclass
class LoadedYaml:
    """Parsed data plus a key-path -> line map for error messages."""

    data: Any
    file: str
    lines: dict = field(default_factory=dict)
    sha256: str = ""  # of the bytes it was parsed from: what a run that read it used

    def line_of(self, path: KeyPath) -> int | None:
        # Fall back to the nearest enclosing key that has a line.
        path = tuple(path)
        while path:
            if path in self.lines:
                return self.lines[path]
            path = path[:-1]
        return self.lines.get((), 1)

    def error(self, path: KeyPath, message: str) -> PipelineError:
        return PipelineError(message, file=self.file, line=self.line_of(path), key=format_path(tuple(path)))


def load_yaml(path: Path, display_name: str | None = None) -> LoadedYaml:
    """Load ``path`` safely; raise PipelineError naming file and line."""
    name = display_name or str(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise PipelineError("file not found", file=name) from None
    except OSError as exc:
        raise PipelineError(f"cannot read: {exc.strerror or exc}", file=name) from None
    return parse_yaml(raw, name)


def parse_yaml(raw: bytes, name: str) -> LoadedYaml:
    """The document in ``raw`` (the bytes of the file called ``name``), as :func:`load_yaml` loads it."""
    if len(raw) > MAX_BYTES:
        raise PipelineError(f"file is {len(raw)} bytes; at most {MAX_BYTES} are accepted", file=name)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        bad_line = raw[: exc.start].count(b"\n") + 1
        raise PipelineError(f"not UTF-8 text (byte 0x{raw[exc.start]:02x})", file=name, line=bad_line) from None
    from etforge.config import yaml_parse  # PyYAML: only when a file is parsed

    data, lines = yaml_parse.parse(text, name)
    return LoadedYaml(data=data, file=name, lines=lines, sha256=hashlib.sha256(raw).hexdigest())
