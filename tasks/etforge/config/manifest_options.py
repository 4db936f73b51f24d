"""The ``manifests:`` section of pipeline.yaml, checked while the plan is resolved.

Planning reads only this check; rendering the manifests (etforge.publish.manifests)
applies the options over etforge.config.defaults.
"""

from __future__ import annotations

import re

PLATFORM_NAME = re.compile(r"^[a-z][a-z0-9_]{0,31}$")


def check_options(raw, backends, recipes, quantizations) -> list:
    """Problems in a ``manifests:`` section as (key path, message) pairs; [] when fine.

    ``backends``: the pipeline's backend names; ``recipes``: known backend recipe names
    (an order may name a backend the pipeline does not build, e.g. the default ``qnn``).
    """
    if raw is None:
        return []
    if not isinstance(raw, dict):
        return [((), f"expected a mapping, got {_kind(raw)}")]
    problems: list = []
    allowed = {"assets_dir", "base_url", "install_dir", "platforms", "models", "app_runtime"}
    for key in sorted(set(raw) - allowed):
        problems.append(((key,), f"unknown key; expected one of {', '.join(sorted(allowed))}"))
    for key in ("assets_dir", "base_url", "install_dir"):
        if key in raw and not isinstance(raw[key], str):
            problems.append(((key,), f"expected a string, got {_kind(raw[key])}"))
    for key in ("assets_dir", "install_dir"):
        value = raw.get(key)
        if isinstance(value, str) and (not value.strip("/") or value.startswith("/") or ".." in value.split("/")):
            problems.append(((key,), f"expected a relative path without '..', got {value!r}"))
    problems += _check_platforms(raw.get("platforms"), ("platforms",), backends, recipes, quantizations)
    models = raw.get("models")
    if models is not None:
        if not isinstance(models, dict):
            problems.append((("models",), f"expected a mapping of model names, got {_kind(models)}"))
        else:
            for name, spec in models.items():
                path = ("models", name)
                if not isinstance(spec, dict):
                    problems.append((path, f"expected a mapping, got {_kind(spec)}"))
                    continue
                model_allowed = {"category", "input_size", "labels_file", "labels_url", "platforms"}
                for key in sorted(set(spec) - model_allowed):
                    problems.append((path + (key,), f"unknown key; expected one of {', '.join(sorted(model_allowed))}"))
                for key in ("category", "labels_file", "labels_url"):
                    if key in spec and not isinstance(spec[key], str):
                        problems.append((path + (key,), f"expected a string, got {_kind(spec[key])}"))
                size = spec.get("input_size")
                if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size <= 0):
                    problems.append((path + ("input_size",), f"expected a positive integer, got {size!r}"))
                problems += _check_platforms(
                    spec.get("platforms"), path + ("platforms",), backends, recipes, quantizations
                )
    return problems


def _check_platforms(platforms, path, backends, recipes, quantizations) -> list:
    if platforms is None:
        return []
    if not isinstance(platforms, dict):
        return [(path, f"expected a mapping of platform -> list of backends, got {_kind(platforms)}")]
    problems: list = []
    known = set(backends) | set(recipes)
    for platform, order in platforms.items():
        if not isinstance(platform, str) or not PLATFORM_NAME.match(platform):
            problems.append(
                (path + (platform,), "expected a platform name such as android, ios, macos, linux, windows or default")
            )
            continue
        if not isinstance(order, list) or not all(isinstance(e, str) for e in order):
            problems.append((path + (platform,), f"expected a list of backend names, got {_kind(order)}"))
            continue
        for i, entry in enumerate(order):
            backend, _, quant = entry.partition("/")
            if backend not in known:
                problems.append(
                    (
                        path + (platform, i),
                        f"unknown backend {backend!r}; declared: {', '.join(backends)} (or any backend recipe)",
                    )
                )
            elif quant and quant not in quantizations:
                problems.append(
                    (path + (platform, i), f"unknown quantization {quant!r}; declared: {', '.join(quantizations)}")
                )
    return problems


def _kind(value) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean", type(None): "nothing"}.get(
        type(value), type(value).__name__
    )
