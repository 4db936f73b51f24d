"""Identifiers and orders the generated files use: Dart and CMake names, fallback orders.

Names come from pipeline names (models, backends, schemes) and must be valid,
distinct identifiers in every language a manifest is written in.
"""

from __future__ import annotations

import re

DART_RESERVED = frozenset(
    """
    abstract as assert async await base break case catch class const continue covariant default
    deferred do dynamic else enum export extends extension external factory false final finally
    for Function get hide if implements import in interface is late library mixin new null of on
    operator part required rethrow return sealed set show static super switch sync this throw
    true try type typedef var void when while with yield
    pipeline pipelineVersion executorchVersion models variants assets hashCode runtimeType
    toString noSuchMethod int double num bool
""".split()
)  # keywords, EtforgeModels' own members, and the lowercase types its body names


def data_file_name(sha256: str) -> str:
    """The shipped name of a program's external weights: its content address, so that cells
    whose weights are identical ship one file (a .pte is named after its cell, ``<stem>.pte``)."""
    return f"{sha256[:16]}.ptd"


def dart_identifier(name: str) -> str:
    """lowerCamelCase Dart identifier for a pipeline name (letters, digits, '_' and '-')."""
    parts = [p for p in re.split(r"[^A-Za-z0-9]+", name) if p]
    if not parts:
        return "unnamed"
    lead = len(parts[0]) - len(
        parts[0].lstrip("ABCDEFGHIJKLMNOPQRSTUVWXYZ")
    )  # YOLO11n -> yolo11n, MobileNet -> mobileNet
    words = [parts[0][:lead].lower() + parts[0][lead:]] + [p[0].upper() + p[1:] for p in parts[1:]]
    ident = "".join(words)
    if ident[0].isdigit():
        ident = "m" + ident
    return ident


def cmake_identifier(name: str) -> str:
    """UPPER_SNAKE part of a CMake variable name."""
    ident = re.sub(r"[^A-Za-z0-9]+", "_", name).strip("_").upper()
    return ident or "UNNAMED"


def unique(names: list, make, reserved=frozenset()) -> dict:
    """name -> identifier, distinct from each other and from ``reserved``; numbered on collision."""
    out, used = {}, set(reserved)
    for name in names:
        base = make(name)
        ident, n = base, 1
        while ident in used:
            n += 1
            ident = f"{base}_{n}"
        used.add(ident)
        out[name] = ident
    return out


def fallback_order(variants: list, order: list, *, chains_by_recipe: bool, append_unlisted: bool = False) -> list:
    """(variant, listed) of ``variants`` in ``order``: each entry (a backend name, a recipe name, or
    ``backend/quantization``) in turn, then, with ``append_unlisted``, the rest in their own order.

    A variant matches its backend's name, or its (primary) recipe's. A chain backend
    (``variant["chain"]`` lists its recipes) matches its recipe too when ``chains_by_recipe``:
    the app manifests list an iOS chain [coreml, xnnpack] under ``coreml``; the C++ header
    (desktop runner, whose runtime may lack a chain's later delegates) matches a chain by its own
    name only. One function, the difference in one argument, both kept as they were.
    """
    out, seen = [], set()
    for entry in order:
        backend, _, quant = entry.partition("/")
        for v in variants:
            names = (v["backend"],) if v.get("chain") and not chains_by_recipe else (v["backend"], v["recipe"])
            if backend in names and (not quant or quant == v["quantization"]) and v["id"] not in seen:
                seen.add(v["id"])
                out.append((v, True))
    if append_unlisted:
        out += [(v, False) for v in variants if v["id"] not in seen]
    return out
