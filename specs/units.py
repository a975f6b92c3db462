"""Binary size units, defined once: memory is counted in bytes and shown in GiB."""

GIB = 1024**3
"""Bytes in a gibibyte."""

MIB = 1024**2
"""Bytes in a mebibyte."""
