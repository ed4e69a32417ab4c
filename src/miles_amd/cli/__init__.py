"""The ``miles-amd`` command line: one module per command."""
