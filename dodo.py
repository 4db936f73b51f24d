"""doit entry of this repository: ``doit``, ``doit export``, ``doit list``, ``doit release --allow-failures``.

pyproject.toml's ``[tool.doit]`` hands doit etforge's task loader, commands, database and
reporter, so ``doit`` here is the ``etforge`` command run on pipeline.yaml (``doit --help``
lists its flags). That loader reads this file as the project's own doit file: the tasks
below run beside the pipeline's (``doit docs``), as any project's can.
"""


def task_docs():
    """build the documentation site into site/ (MkDocs, strict: a broken link fails)"""
    return {"actions": ["mkdocs build --strict --quiet --site-dir site"], "verbosity": 2, "uptodate": [False]}
