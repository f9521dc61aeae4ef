"""``python -m fedshift.cli``: the ``fedshift`` command."""

from fedshift.cli import main

main()
