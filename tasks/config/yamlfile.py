"""Safe YAML loading that remembers the line of every key.

Only plain YAML is accepted (``yaml.SafeLoader`` resolution): tags that try to
construct Python objects, duplicate keys and alias bombs are errors naming
the line, not surprises later.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from etforge.core.errors import PipelineError

# Generous for any real pipeline; stops "billion laughs" alias expansion.
MAX_NODES = 200_000
# Real pipelines nest about 6 levels; a limit keeps PyYAML's recursive composer
# (and everything after it) away from RecursionError on "[[[[...".
MAX_DEPTH = 32
# A pipeline is a few hundred lines. Pure-Python PyYAML needs ~40 us per value,
# so this caps a hostile or mistaken file at a few seconds of parsing.
MAX_BYTES = 256 << 10

KeyPath = tuple  # of str | int

# The only tags plain data may carry. Everything else (!!python/..., !!binary,
# !!set, local !tags) is refused, also on mappings and sequences, where a tag
# would otherwise be silently ignored.
_YAML_TAG = "tag:yaml.org,2002:"
PLAIN_TAGS = {_YAML_TAG + t for t in ("str", "int", "float", "bool", "null", "timestamp", "map", "seq")}

# PyYAML's wording for the commonest mistakes, said plainly.
_SYNTAX_HINTS = (
    ("found character '\\t' that cannot start any token", "tab character; YAML must be indented with spaces"),
    ("expected <block end>", "bad indentation: this line does not line up with the lines above it"),
    (
        "mapping values are not allowed here",
        "unexpected ':' (bad indentation, or a value containing ': ' that needs quotes)",
    ),
    ("but found another document", "a second YAML document ('---'); the file must hold a single document"),
    ("found unexpected end of stream", "the file ends inside it"),
)
# Unclosed brackets and quotes are reported on the line where they were opened.
_UNCLOSED = {
    "while parsing a flow sequence": "'['",
    "while parsing a flow mapping": "'{'",
    "while scanning a quoted scalar": "quote",
}

_PLAIN_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def format_path(path: KeyPath) -> str:
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _PLAIN_KEY.match(str(part)):
            out += ("." if out else "") + str(part)
        else:  # quoted, so that a key like "../x" or "a.b" stays unambiguous
            out += f"[{json.dumps(str(part))}]"
    return out or "(top level)"


def _show_tag(tag: str) -> str:
    return "!!" + tag[len(_YAML_TAG) :] if tag.startswith(_YAML_TAG) else tag


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
        return PipelineError(message, file=self.file, line=self.line_of(path), key=format_path(tuple(path)))


class _Builder:
    def __init__(self, file: str):
        self.file = file
        self.loader = yaml.SafeLoader("")
        self.lines: dict = {}
        self.count = 0

    def fail(self, node: yaml.Node, path: KeyPath, message: str) -> PipelineError:
        return PipelineError(message, file=self.file, line=node.start_mark.line + 1, key=format_path(path))

    def check_tag(self, node: yaml.Node, path: KeyPath) -> None:
        if node.tag not in PLAIN_TAGS:
            raise self.fail(node, path, f"unsupported YAML tag {_show_tag(node.tag)!r}: only plain data is allowed")

    def build(self, node: yaml.Node, path: KeyPath) -> Any:
        self.count += 1
        if self.count > MAX_NODES:
            # Blame the top-level key being expanded, not a random leaf deep inside it.
            top = path[:1]
            raise PipelineError(
                f"document expands to more than {MAX_NODES} values (YAML aliases nested into an alias bomb?)",
                file=self.file,
                line=self.lines.get(top, node.start_mark.line + 1),
                key=format_path(top),
            )
        if len(path) > MAX_DEPTH:  # only reachable through aliases; the parse walk caught the rest
            raise self.fail(node, path[:1], f"nested more than {MAX_DEPTH} levels deep")
        self.lines.setdefault(path, node.start_mark.line + 1)
        if isinstance(node, yaml.MappingNode):
            if node.tag != _YAML_TAG + "map":
                self.check_tag(node, path)
            out: dict = {}
            for key_node, value_node in node.value:
                if key_node.tag == _YAML_TAG + "merge":
                    raise self.fail(key_node, path, "YAML merge keys (<<) are not supported; write the keys out")
                if not isinstance(key_node, yaml.ScalarNode):
                    raise self.fail(key_node, path, "mapping keys must be plain strings")
                self.scalar(key_node, path)  # refuses tagged keys
                # A key is the text as written: `on:` or `1.0:` stay "on" and "1.0"
                # rather than becoming True or 1.0 and then "True" or "1.0".
                key = key_node.value
                if key in out:
                    raise self.fail(
                        key_node,
                        path + (key,),
                        f"duplicate key {key!r} (first defined on line {self.lines[path + (key,)]})",
                    )
                self.lines[path + (key,)] = key_node.start_mark.line + 1
                out[key] = self.build(value_node, path + (key,))
            return out
        if isinstance(node, yaml.SequenceNode):
            if node.tag != _YAML_TAG + "seq":
                self.check_tag(node, path)
            return [self.build(item, path + (i,)) for i, item in enumerate(node.value)]
        return self.scalar(node, path)

    def scalar(self, node: yaml.Node, path: KeyPath) -> Any:
        self.check_tag(node, path)
        if node.tag == _YAML_TAG + "timestamp":
            # No field is a date; keep `name: 2024-01-01` as the text the user wrote.
            return node.value
        try:
            return self.loader.construct_object(node, deep=True)
        except Exception:  # e.g. `!!int abc`: PyYAML raises ValueError/KeyError here
            raise self.fail(node, path, f"{node.value!r} is not a valid {_show_tag(node.tag)}") from None


# libyaml's parser when PyYAML has it: 20x faster on a no-op run, which parses the pipeline and every
# backend recipe. A document it refuses is parsed again by PyYAML's own, whose messages errors quote.
_FAST_LOADER = getattr(yaml, "CSafeLoader", None)


def _walk_events(
    text: str, stop_index: int | None = None, loader: type = yaml.SafeLoader
) -> tuple[KeyPath, int | None, bool]:
    """(key path, line, too deep?) where the event parser stopped.

    PyYAML's syntax errors carry a line but no key path; replaying the event
    stream recovers where in the document the parser was (up to
    ``stop_index`` or the error). The parser is iterative, so this is also how
    "[[[[..." nested thousands deep is refused quickly, before PyYAML's
    recursive composer runs into RecursionError (and quadratic scanning).
    """
    stack: list = []  # [is_mapping, nodes seen (keys and values), current key]
    line = None

    def path() -> KeyPath:
        out = []
        for depth, (is_map, seen, key) in enumerate(stack):
            innermost = depth == len(stack) - 1
            if is_map and seen % 2 == 1:  # a key was read, its value is in progress
                out.append(key)
            elif not is_map and not innermost:
                out.append(seen)
        return tuple(out)

    try:
        for event in yaml.parse(text, Loader=loader):
            mark = event.start_mark
            if mark is None:
                continue
            if stop_index is not None and mark.index >= stop_index:
                break
            line = mark.line + 1
            if isinstance(event, yaml.CollectionEndEvent):
                stack.pop()
                if stack:
                    stack[-1][1] += 1
            elif isinstance(event, yaml.NodeEvent):
                if stack and stack[-1][0] and stack[-1][1] % 2 == 0 and isinstance(event, yaml.ScalarEvent):
                    stack[-1][2] = event.value
                if isinstance(event, yaml.CollectionStartEvent):
                    if len(stack) >= MAX_DEPTH:
                        return path(), line, True
                    stack.append([isinstance(event, yaml.MappingStartEvent), 0, None])
                elif stack:
                    stack[-1][1] += 1
    except yaml.YAMLError:
        pass  # the caller reports the error itself
    return path(), line, False


def _syntax_error(name: str, text: str, exc: yaml.MarkedYAMLError) -> PipelineError:
    problem_mark, context_mark = exc.problem_mark, exc.context_mark
    problem = exc.problem or exc.context or "invalid YAML"
    for needle, plain in _SYNTAX_HINTS:
        if needle in problem:
            problem = plain
    mark = problem_mark or context_mark
    opener = _UNCLOSED.get(exc.context or "")
    if opener and context_mark and problem_mark:
        # The fix belongs where the bracket or quote was opened.
        at_end = "<stream end>" in problem or "file ends" in problem
        found = "" if at_end or problem_mark.line == context_mark.line else f" on line {problem_mark.line + 1}"
        problem = f"{opener} is never closed ({problem}{found})"
        mark = context_mark
    path, _, _ = _walk_events(text, mark.index if mark else None)
    return PipelineError(
        f"YAML syntax error: {problem}", file=name, line=mark.line + 1 if mark else None, key=format_path(path)
    )


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
    node = _fast_compose(text)
    if node is not None:
        builder = _Builder(name)
        return LoadedYaml(data=builder.build(node, ()), file=name, lines=builder.lines)
    where, line, too_deep = _walk_events(text)
    if too_deep:  # name the top-level key: the full path would be 32 levels of [0][0]...
        raise PipelineError(
            f"nested more than {MAX_DEPTH} levels deep", file=name, line=line, key=format_path(where[:1])
        )
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        raise _syntax_error(name, text, exc) from None
    except yaml.YAMLError as exc:
        raise PipelineError(f"YAML error: {str(exc).splitlines()[0]}", file=name) from None
    if node is None:
        raise PipelineError("expected a mapping, got an empty file", file=name, line=1, key=format_path(()))
    builder = _Builder(name)
    data = builder.build(node, ())
    return LoadedYaml(data=data, file=name, lines=builder.lines)


def _fast_compose(text: str) -> yaml.Node | None:
    """The document's node tree through libyaml, or None (no libyaml, an error, too deep, empty):
    then PyYAML's own parser runs and says what is wrong in its words."""
    if _FAST_LOADER is None:
        return None
    try:
        _, _, too_deep = _walk_events(text, loader=_FAST_LOADER)
        if too_deep:
            return None
        return yaml.compose(text, Loader=_FAST_LOADER)
    except yaml.YAMLError:
        return None
