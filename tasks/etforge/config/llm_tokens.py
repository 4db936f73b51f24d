"""An LLM's validation tokens, checked when the plan is built: a token file or a text and its tokenizer.

- ``validation: {tokens: data/val.npz}``: an ``.npz`` with one integer array of token ids (any shape;
  read flattened, in order).
- ``validation: {text: data/val.txt, tokenizer: data/tokenizer.json}``: a UTF-8 text encoded with a
  Hugging Face ``tokenizer.json`` (the ``tokenizers`` library, as the model's tokenizer does it,
  special tokens included). Without ``tokenizer``, the transformers checkpoint's ``tokenizer.json``.

Their first window of ``prompt_len + decode_steps`` ids is what the LLM cell is validated on
(etforge.builders.llm.export): the prompt, then the tokens fed to the decode steps, which give
perplexity and KL divergence (etforge.builders.llm.quality). A file too short for that window, ids
outside the vocabulary and a missing file are one-line errors naming the file, line and key.
"""

from __future__ import annotations

from pathlib import Path

from etforge.core.digest import digest

TOKENS = "tokens"
TEXT = "text"
TOKENIZER = "tokenizer"
TOKENIZER_FILE = "tokenizer.json"


def read_token_ids(root: Path, validation: dict):
    """The resolved validation's token ids, flattened (numpy int64): the file's, or the encoded text's."""
    import numpy as np

    if TOKENS in validation:
        with np.load(Path(root) / validation[TOKENS]) as data:
            return data[data.files[0]].reshape(-1).astype(np.int64)
    return encode_text(Path(root) / validation[TEXT], Path(root) / validation[TOKENIZER])


def encode_text(text: Path, tokenizer: Path):
    """``text`` encoded by the tokenizer.json at ``tokenizer`` (special tokens added as its post-processor
    says): the ids the model's own tokenizer gives."""
    import numpy as np
    from tokenizers import Tokenizer

    encoding = Tokenizer.from_file(str(tokenizer)).encode(text.read_text(encoding="utf-8"))
    return np.asarray(encoding.ids, dtype=np.int64)


def token_source(validation: dict) -> str:
    """What a cell's record says it was validated on: 'tokens data/val.npz' or 'text data/val.txt
    (tokenizer data/tokenizer.json)'."""
    if TOKENS in validation:
        return f"tokens {validation[TOKENS]}"
    return f"text {validation[TEXT]} (tokenizer {validation[TOKENIZER]})"


def token_stats(read) -> dict:
    """{"length", "min", "max"} of the ids ``read()`` returns, or {"error": why}. Numpy and tokenizers
    are imported only here: planning reads the files once per content (memoised by digest)."""
    import zipfile

    try:
        ids = read()
    except (OSError, ValueError, zipfile.BadZipFile, EOFError, UnicodeDecodeError) as exc:
        return {"error": f"cannot be read ({type(exc).__name__}: {exc})"}
    except Exception as exc:  # the tokenizers library raises its own Exception on a bad tokenizer.json
        return {"error": f"cannot be encoded ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"}
    if isinstance(ids, dict):  # the npz reader's own complaint
        return ids
    if ids.size == 0:
        return {"length": 0, "min": 0, "max": 0}
    return {"length": int(ids.size), "min": int(ids.min()), "max": int(ids.max())}


def npz_token_ids(full: Path):
    """The one integer array of the ``.npz`` at ``full``, or {"error": why}."""
    import numpy as np

    with np.load(full) as data:
        names = list(data.files)
        if len(names) != 1:
            return {"error": f"holds {len(names)} arrays ({', '.join(names) or 'none'}); expected one of token ids"}
        ids = data[names[0]]
    if ids.dtype.kind not in "iu":
        return {"error": f"array {names[0]!r} holds {ids.dtype}, not integer token ids"}
    return ids.reshape(-1)


def tokens_problem(stats: dict, window: int, vocab: int) -> str | None:
    """Why validation tokens of ``stats`` cannot validate a cell (window = prompt_len + decode_steps), or None."""
    if "error" in stats:
        return stats["error"]
    if stats["length"] < window:
        return (
            f"holds {stats['length']} token ids, too short for one window of {window} "
            "(llm.prompt_len + llm.decode_steps)"
        )
    if stats["min"] < 0 or stats["max"] >= vocab:
        return f"holds token ids in [{stats['min']}, {stats['max']}], outside the vocabulary [0, {vocab})"
    return None


def resolve_tokens(r, spec: dict, path: tuple, source: dict, inputs: tuple) -> dict:
    """``validation: {tokens: ...}`` or ``{text: ..., tokenizer: ...}`` of a text-generation model:
    the resolved entry (relative paths) plus ``sha256``, a digest of what the ids depend on.
    ``r``: the resolver (its document, root, digest cache and tool versions)."""
    kind = TOKENS if TOKENS in spec else TEXT
    where = path + (kind,)
    transformers = source.get("transformers") or {}
    llm = transformers.get("llm")
    if llm is None:
        raise r.doc.error(where, f"a {kind} file validates a text-generation model only (transformers task)")
    extra = sorted(set(spec) - ({TOKENS} if kind == TOKENS else {TEXT, TOKENIZER}))
    if extra:
        raise r.doc.error(path + (extra[0],), f"'{extra[0]}' does not go with a {kind} file")
    full = _existing(r, spec[kind], where, "token file" if kind == TOKENS else "text file")
    resolved = {kind: r.rel(full)}
    if kind == TOKENS:
        content = r.file_digest(full, where)
        stats = r.digests.derived("llm_token_stats", content, lambda: token_stats(lambda: npz_token_ids(full)))
    else:
        tokenizer = _tokenizer(r, spec, path, transformers)
        resolved[TOKENIZER] = r.rel(tokenizer)
        version = r.versions.distribution("tokenizers")
        # the ids depend on the text, the tokenizer and the library that applies it
        content = digest([r.file_digest(full, where), r.file_digest(tokenizer, path + (TOKENIZER,)), version])
        stats = r.digests.derived("llm_text_stats", content, lambda: token_stats(lambda: encode_text(full, tokenizer)))
    vocab = inputs[0].range[1]  # the implied input_ids' range: [0, vocab_size)
    problem = tokens_problem(stats, llm["prompt_len"] + llm["decode_steps"], vocab)
    if problem:
        what = spec[kind] if kind == TOKENS else f"{spec[kind]} encoded by {resolved[TOKENIZER]}"
        raise r.doc.error(where, f"{what} {problem}")
    return {**resolved, "sha256": content}


def _existing(r, rel: str, where: tuple, what: str) -> Path:
    full = r.inside_root(rel, where)
    if not full.is_file():
        raise r.doc.error(where, f"{what} {rel!r} not found")
    return full


def _tokenizer(r, spec: dict, path: tuple, transformers: dict) -> Path:
    """The tokenizer.json encoding a validation text: ``tokenizer`` (a file, or a folder holding one),
    else the checkpoint's."""
    if TOKENIZER in spec:
        full = r.inside_root(spec[TOKENIZER], path + (TOKENIZER,))
        if full.is_dir():
            full = full / TOKENIZER_FILE
        if not full.is_file():
            raise r.doc.error(path + (TOKENIZER,), f"tokenizer {spec[TOKENIZER]!r} not found (a {TOKENIZER_FILE})")
        return full
    checkpoint = (transformers.get("checkpoint") or {}).get("path")
    candidate = r.root / checkpoint / TOKENIZER_FILE if checkpoint else None
    if candidate is None or not candidate.is_file():
        raise r.doc.error(
            path + (TEXT,),
            f"a validation text needs the model's tokenizer: name its {TOKENIZER_FILE} under 'tokenizer'"
            + (f" (checkpoint {checkpoint!r} has none)" if checkpoint else " (the model has no checkpoint)"),
        )
    return r.inside_root(r.rel(candidate.resolve()), path + (TEXT,))
