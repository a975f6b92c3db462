"""Runners: the command line, the grid of (budget, planner) cells run in a process pool or on Ray,
the result records and reports. Above planners, simulator and executor; nothing below imports it."""
