"""The help convention shared by the command lines: ``--help`` shows every flag's default."""
from __future__ import annotations

import argparse


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the description's line breaks and appends ``(default: X)`` to every flag that has
    a default worth showing (not None, False or empty, not already in the help text)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if "%(default)" in text or not action.option_strings or _nothing(default):
            return text
        shown = " ".join(map(str, default)) if isinstance(default, (list, tuple)) else "%(default)s"
        return f"{text} (default: {shown})"



def _nothing(default: object) -> bool:
    # identity, not ==: a default of 0 is worth showing, False (a store_true flag) is not
    return default is None or default is False or default is argparse.SUPPRESS or default in ([], ())
