"""Moved to ``python -m analysis.validate`` (same flags): it joins the executor, the cost models
and the simulator, so it sits in the layer above them (pyproject.toml [tool.importlinter])."""
import sys

if __name__ == "__main__":
    print("error: python -m executor.validate moved to python -m analysis.validate (same flags)", file=sys.stderr)
    sys.exit(2)
