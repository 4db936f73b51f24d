"""``python -m etforge``: the ``etforge`` command."""

from etforge.app.cli import main

raise SystemExit(main())
