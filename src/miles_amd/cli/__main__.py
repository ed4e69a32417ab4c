"""``python -m miles_amd.cli``: the same as the ``miles-amd`` command."""

from miles_amd.cli.main import main

main()
