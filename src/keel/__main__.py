"""``python -m keel``: the same as the ``keel`` command."""

from keel.cli.app import main

main()
