"""``python -m graphdiff_cli.cli``: the same as the ``graphdiff`` command."""

from .app import main

main()
