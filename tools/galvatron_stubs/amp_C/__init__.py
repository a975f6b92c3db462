"""Import stand-in for amp_C (CUDA-only; Galvatron's search engine never calls it)."""
from _standin import StandIn


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return StandIn("amp_C." + name)
