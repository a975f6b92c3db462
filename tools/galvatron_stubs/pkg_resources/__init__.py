"""Import stand-in for pkg_resources (CUDA-only; Galvatron's search engine never calls it)."""
from _standin import StandIn


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return StandIn("pkg_resources." + name)
