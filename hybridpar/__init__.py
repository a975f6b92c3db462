"""The ``hybridpar`` command: one entry point over the packages' command lines (``hybridpar/cli.py``)."""
