"""doit's ``list`` and ``info``, described as what they show of an etforge project.

doit says "list tasks from dodo file"; etforge has no dodo file in a user's project. Only the
descriptions change (doit's extension API: a command plugin of the same name replaces doit's).
"""

from __future__ import annotations

from doit.cmd_info import Info as DoitInfo
from doit.cmd_list import List as DoitList


class List(DoitList):
    name = "list"
    doc_purpose = "list the stages of pipeline.yaml (with --all: every task, one per model, graph or cell)"


class Info(DoitInfo):
    name = "info"
    doc_purpose = "show one task: what it depends on, what it writes and whether it is up to date"
