"""Partitioner factories named by backend recipes (``partitioner: module:function``).

Each function takes the resolved recipe options and returns the list of
ExecuTorch partitioners, importing its backend lazily.
"""

from __future__ import annotations

import importlib


def load_factory(ref: str):
    module_name, func_name = ref.split(":")
    return getattr(importlib.import_module(module_name), func_name)


def partitioners_for(backend) -> list:
    if backend.partitioner is None:
        return []
    return list(load_factory(backend.partitioner)(dict(backend.options)))


def xnnpack(options: dict) -> list:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    return [XnnpackPartitioner(per_op_mode=bool(options.get("per_op_mode", False)))]
