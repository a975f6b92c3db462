"""Shared stand-in object for the CUDA-only modules Galvatron's runtime imports but its search never calls."""


class StandIn:
    """Any attribute or call fails loudly, so a stand-in can never silently take part in a computation."""

    def __init__(self, name):
        self._name = name

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{self._name} is an import stand-in (CUDA-only module absent on this machine)")

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return StandIn(f"{self._name}.{attr}")

    def __mro_entries__(self, bases):
        return (object,)
