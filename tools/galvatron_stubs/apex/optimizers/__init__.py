"""Import stand-in for apex.optimizers (CUDA-only; Galvatron's search engine never calls it)."""
from _standin import StandIn


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return StandIn("apex.optimizers." + name)
