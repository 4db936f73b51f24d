"""Safe YAML loading that remembers the line of every key.

Only plain YAML is accepted (``yaml.SafeLoader`` resolution): tags that try to
construct Python objects, duplicate keys and alias bombs are errors naming
the line, not surprises later.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tasks.errors import PipelineError

# Generous for any real pipeline; stops "billion laughs" alias expansion.
MAX_NODES = 200_000

KeyPath = tuple  # of str | int


def format_path(path: KeyPath) -> str:
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


@dataclass
class LoadedYaml:
    """Parsed data plus a key-path -> line map for error messages."""

    data: Any
    file: str
    lines: dict = field(default_factory=dict)

    def line_of(self, path: KeyPath) -> int | None:
        # Fall back to the nearest enclosing key that has a line.
        path = tuple(path)
        while path:
            if path in self.lines:
                return self.lines[path]
            path = path[:-1]
        return self.lines.get((), 1)

    def error(self, path: KeyPath, message: str) -> PipelineError:
        return PipelineError(message, file=self.file, line=self.line_of(path),
                             key=format_path(tuple(path)))


class _Builder:
    def __init__(self, file: str):
        self.file = file
        self.loader = yaml.SafeLoader("")
        self.lines: dict = {}
        self.count = 0

    def fail(self, node: yaml.Node, path: KeyPath, message: str) -> PipelineError:
        return PipelineError(message, file=self.file, line=node.start_mark.line + 1,
                             key=format_path(path) if path else None)

    def build(self, node: yaml.Node, path: KeyPath) -> Any:
        self.count += 1
        if self.count > MAX_NODES:
            raise self.fail(node, path, f"document too large (more than {MAX_NODES} nodes; alias bomb?)")
        self.lines.setdefault(path, node.start_mark.line + 1)
        if isinstance(node, yaml.MappingNode):
            out: dict = {}
            for key_node, value_node in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    raise self.fail(key_node, path, "YAML merge keys (<<) are not supported")
                if not isinstance(key_node, yaml.ScalarNode):
                    raise self.fail(key_node, path, "mapping keys must be plain strings")
                key = self.scalar(key_node, path)
                if not isinstance(key, str):
                    key = str(key)
                if key in out:
                    raise self.fail(key_node, path + (key,),
                                    f"duplicate key {key!r} (first defined on line {self.lines[path + (key,)]})")
                self.lines[path + (key,)] = key_node.start_mark.line + 1
                out[key] = self.build(value_node, path + (key,))
            return out
        if isinstance(node, yaml.SequenceNode):
            return [self.build(item, path + (i,)) for i, item in enumerate(node.value)]
        return self.scalar(node, path)

    def scalar(self, node: yaml.Node, path: KeyPath) -> Any:
        try:
            return self.loader.construct_object(node, deep=True)
        except yaml.constructor.ConstructorError as exc:
            raise self.fail(node, path, f"unsupported YAML tag {node.tag!r}: only plain data is allowed") from None


def load_yaml(path: Path, display_name: str | None = None) -> LoadedYaml:
    """Load ``path`` safely; raise PipelineError naming file and line."""
    name = display_name or str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PipelineError("file not found", file=name) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise PipelineError(f"cannot read: {exc}", file=name) from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        problem = exc.problem or exc.context or "invalid YAML"
        raise PipelineError(f"YAML syntax error: {problem}", file=name, line=line) from None
    except yaml.YAMLError as exc:
        raise PipelineError(f"YAML error: {str(exc).splitlines()[0]}", file=name) from None
    if node is None:
        raise PipelineError("file is empty", file=name, line=1)
    builder = _Builder(name)
    data = builder.build(node, ())
    return LoadedYaml(data=data, file=name, lines=builder.lines)
