"""Import stand-in for apex.multi_tensor_apply (CUDA-only; Galvatron's search engine never calls it)."""
from _standin import StandIn


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return StandIn("apex.multi_tensor_apply." + name)
