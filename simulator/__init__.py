"""SimPy discrete-event simulation of one training iteration of a Plan: GPU streams, shared
links with max-min fair flows, memory that can run out, Chrome/Perfetto traces."""
from simulator.engine import simulate
from simulator.hardware import OOMEvent
from simulator.result import SimResult

__all__ = ["simulate", "SimResult", "OOMEvent"]
