"""An LLM's validation token file (``validation: {tokens: data/val.npz}``), checked when the plan is built.

The file is an ``.npz`` with one integer array of token ids (any shape; read flattened, in order).
Its first window of ``prompt_len + decode_steps`` ids is what the LLM cell is validated on
(etforge.builders.llm.export): the prompt, then the tokens fed to the decode steps, which give
perplexity and KL divergence (etforge.builders.llm.quality). A file too short for that window, ids
outside the vocabulary and a missing file are one-line errors naming the file, line and key.
"""

from __future__ import annotations

TOKENS = "tokens"


def token_stats(full) -> dict:
    """{"length", "min", "max"} of the token ids in the ``.npz`` at ``full``, or {"error": why}.
    Numpy is imported here only: planning reads the file once per content (memoised by digest)."""
    import zipfile

    import numpy as np

    try:
        with np.load(full) as data:
            names = list(data.files)
            if len(names) != 1:
                return {"error": f"holds {len(names)} arrays ({', '.join(names) or 'none'}); expected one of token ids"}
            ids = data[names[0]]
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        return {"error": f"is not an .npz of token ids ({type(exc).__name__}: {exc})"}
    if ids.dtype.kind not in "iu":
        return {"error": f"array {names[0]!r} holds {ids.dtype}, not integer token ids"}
    if ids.size == 0:
        return {"length": 0, "min": 0, "max": 0}
    return {"length": int(ids.size), "min": int(ids.min()), "max": int(ids.max())}


def tokens_problem(stats: dict, window: int, vocab: int) -> str | None:
    """Why a token file of ``stats`` cannot validate a cell (window = prompt_len + decode_steps), or None."""
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
    """``validation: {tokens: ...}`` of a text-generation model: {"tokens": rel path, "sha256": digest}.
    ``r``: the resolver (its document, root and digest cache)."""
    where = path + (TOKENS,)
    llm = (source.get("transformers") or {}).get("llm")
    if llm is None:
        raise r.doc.error(where, "a token file validates a text-generation model only (transformers task)")
    extra = sorted(set(spec) - {TOKENS})
    if extra:
        raise r.doc.error(path + (extra[0],), f"'{extra[0]}' does not go with a token file")
    full = r.inside_root(spec[TOKENS], where)
    if not full.is_file():
        raise r.doc.error(where, f"token file {spec[TOKENS]!r} not found")
    content = r.file_digest(full, where)
    stats = r.digests.derived("llm_token_stats", content, lambda: token_stats(full))
    vocab = inputs[0].range[1]  # the implied input_ids' range: [0, vocab_size)
    problem = tokens_problem(stats, llm["prompt_len"] + llm["decode_steps"], vocab)
    if problem:
        raise r.doc.error(where, f"{spec[TOKENS]} {problem}")
    return {TOKENS: r.rel(full), "sha256": content}
