"""Experiments that write result files (one folder and one table row per run) and the figures
and tables drawn from them: ``python -m analysis.figures [--quick]``."""
