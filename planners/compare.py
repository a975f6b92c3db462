"""``python -m planners.compare``, the README's command, kept as an entry point: the command line
lives in ``runners.compare`` (above the planners), which this module only starts."""
import sys

from runners.compare import main

if __name__ == "__main__":
    sys.exit(main())
