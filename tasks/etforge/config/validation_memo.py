"""What a run need not validate again: data that passed the very same checks before.

    memo = validation_memo(digests, versions, code)
    memo.once(value, check)   check() unless ``value`` passed under the same salt before

Schema validation (etforge.config.schema) and a recipe's option check (etforge.config.recipes
check_options) are pure functions of the data checked, the schema files, the checking code and
jsonschema. The memo keys a pass by a digest of the value (its ``repr``: 4 and 4.0, "1" and 1
stay apart, as they do for the schema) under a salt of the schemas' bytes, the import closure of
the checking code and the versions of jsonschema and its referencing library, so that a no-op run
validates nothing and never imports jsonschema (0.1-0.4 s here). Only a pass is remembered: a bad
file is checked again every time and gives the same one-line error. Entries live in the project's
DigestCache, which is saved only once the whole plan checked out (a bad input writes nothing).

Parsing a YAML file is such a pure function too (of its bytes, etforge.config.yamlfile and PyYAML):
``memo.load_yaml(path, name)`` keeps a parsed pipeline.yaml or recipe by the sha256 of its bytes
under the same salt, so a no-op run parses no YAML and does not import PyYAML (together about
20 ms here). Only a file that loaded is kept, and only when its data survive a JSON round trip
unchanged (a timestamp does not). A Hugging Face config's key check (config/hf_source.py) is
remembered like a validation, so transformers' version is in the salt.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from etforge.config.code_deps import CodeDigests
from etforge.config.digest_cache import DigestCache
from etforge.config.yamlfile import LoadedYaml, load_yaml, parse_yaml
from etforge.core.digest import digest
from etforge.core.paths import SCHEMA_DIR

KIND = "validated"  # DigestCache.derived kind of a pass; the salt is part of each entry's key
PARSED = "parsed-yaml"  # DigestCache.derived kind of a parsed file
CHECKING_CODE = (
    "etforge.config.schema",
    "etforge.config.recipes",
    "etforge.config.yamlfile",
    "etforge.config.hf_source",
)
LIBRARIES = ("jsonschema", "referencing", "jsonschema-specifications", "PyYAML", "transformers")


class ValidationMemo:
    def __init__(self, digests: DigestCache, salt: str):
        self.digests = digests
        self.salt = salt

    def key(self, value) -> str:
        return hashlib.sha256(f"{self.salt}\n{value!r}".encode()).hexdigest()

    def once(self, value, check: Callable[[], Any]) -> Any:
        """``check()`` (None or an empty result: a pass; a raise or a non-empty result: a failure)
        unless ``value`` passed before; None when it did."""
        key = self.key(value)
        if self.digests.knows(KIND, key):
            return None
        result = check()
        if not result:
            self.digests.remember(KIND, key)
        return result

    def _parsed_key(self, content_sha256: str) -> str:
        return hashlib.sha256(f"{self.salt}\n{content_sha256}".encode()).hexdigest()

    def load_yaml(self, path: Path, name: str) -> LoadedYaml:
        """yamlfile.load_yaml(path, name), from the memo when these bytes loaded before."""
        try:
            content = self.digests.file_digest(Path(path))
            key = self._parsed_key(content)
            kept = (
                _kept(self.digests.derived_entries[PARSED][key], name, content)
                if self.digests.knows(PARSED, key)
                else None
            )
            if kept is not None:
                return kept
            raw = Path(path).read_bytes()
        except OSError:  # missing, unreadable: load_yaml says which, as one line
            return load_yaml(Path(path), name)
        doc = parse_yaml(raw, name)  # hashed (below) and parsed from the same bytes
        try:
            text = json.dumps({"data": doc.data, "lines": [[list(p), line] for p, line in doc.lines.items()]})
            keep = json.loads(text)["data"] == doc.data
        except (TypeError, ValueError):  # e.g. a timestamp
            keep = False
        if keep:
            key = self._parsed_key(hashlib.sha256(raw).hexdigest())
            self.digests.remember(PARSED, key, text)
        return doc


def _kept(text, name: str, content_sha256: str) -> LoadedYaml | None:
    """A kept parse (fresh objects: callers may change them); None when it is not one (a miss)."""
    try:
        kept = json.loads(text)
        if not isinstance(kept["data"], dict):  # every file kept is a mapping (a pipeline, a recipe)
            return None
        lines = {tuple(p): int(line) for p, line in kept["lines"]}
        return LoadedYaml(data=kept["data"], file=name, lines=lines, sha256=content_sha256)
    except (TypeError, ValueError, KeyError, RecursionError):
        return None


def validation_memo(
    digests: DigestCache, version: Callable[[str], str | None], code: CodeDigests | None = None
) -> ValidationMemo:
    """The memo of a project's DigestCache; ``version``: a memoising distribution-version lookup;
    ``code``: the plan's digests of etforge's code (one import graph walk for both)."""
    schemas = {p.name: digests.file_digest(p) for p in sorted(SCHEMA_DIR.glob("*.json"))}
    salt = digest(
        {
            "schemas": schemas,
            "code": (code or CodeDigests(digests)).of(CHECKING_CODE),
            "libraries": {name: version(name) for name in LIBRARIES},
            "python": sys.version,
        }
    )
    return ValidationMemo(digests, salt)
