"""The YAML parsing behind etforge.config.yamlfile: PyYAML (through libyaml when it has it) with a
line for every key, plain data only, and PyYAML's errors said plainly.

Apart from yamlfile so that importing the loader's types does not import PyYAML (about 7 ms):
a no-op run takes pipeline.yaml and its recipes from the digest memo and parses nothing.
"""

from __future__ import annotations

from typing import Any

import yaml

from etforge.core.errors import PipelineError
from etforge.core.key_path import KeyPath, format_path

# Generous for any real pipeline; stops "billion laughs" alias expansion.
MAX_NODES = 200_000
# Real pipelines nest about 6 levels; a limit keeps PyYAML's recursive composer
# (and everything after it) away from RecursionError on "[[[[...".
MAX_DEPTH = 32
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


def _show_tag(tag: str) -> str:
    return "!!" + tag[len(_YAML_TAG) :] if tag.startswith(_YAML_TAG) else tag


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


def parse(text: str, name: str) -> tuple[Any, dict]:
    """(data, key path -> line) of the document in ``text`` (of the file called ``name``); raise
    PipelineError naming file and line."""
    node = _fast_compose(text)
    if node is not None:
        builder = _Builder(name)
        return builder.build(node, ()), builder.lines
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
    return builder.build(node, ()), builder.lines


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
