"""etforge: pipeline.yaml -> validated ExecuTorch programs, manifests and release bundles.

This package is imported while doit plans; keep torch and executorch imports
inside task actions.
"""

__version__ = "0.1.0"
