"""``hybridpar SUBCOMMAND ...``: each subcommand is a module's own command line, started with the
arguments that follow it (``hybridpar plan --help`` is ``python -m planners.compare --help``)."""
from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from typing import Sequence

from specs import SpecError
from specs.cli import invoked_as
from specs.errors import one_line_errors


@dataclass(frozen=True)
class Subcommand:
    """One subcommand: the module whose ``main(argv)`` runs it, and the words put before the user's."""

    module: str
    help: str
    prefix: str = ""
    """A flag that takes the subcommand's first word (``export megatron`` is ``--to megatron``)."""


SUBCOMMANDS = {
    "plan": Subcommand("runners.compare", "choose plans: planners x memory budgets on a model and cluster "
                       "(--config FILE.toml; the zero-argument run is the paper's comparison)"),
    "compare": Subcommand("runners.compare", "the same as plan"),
    "simulate": Subcommand("simulator.run", "play one iteration of a plan file (or a uniform plan) in the simulator"),
    "run": Subcommand("executor.run", "run a plan in PyTorch (gloo processes or GPUs), --check its numerics"),
    "profile": Subcommand("executor.profile", "measure a profile for the profiled cost model"),
    "validate": Subcommand("analysis.validate", "run a plan and put the predictions beside the measurement"),
    "export": Subcommand("frameworks.export", "FRAMEWORK PLAN.json: write a plan as a framework's files",
                         prefix="--to"),
    "import": Subcommand("frameworks.export", "FRAMEWORK FILE... (megatron: or -- FLAGS): a framework's "
                         "files or flags to a plan file", prefix="--from"),
    "list": Subcommand("runners.compare", "KIND: print the models, clusters, planners, cost-models, "
                       "evaluators or frameworks", prefix="--list"),
}


def usage() -> str:
    width = max(map(len, SUBCOMMANDS))
    lines = [f"  {name:<{width}}  {sub.help}" for name, sub in SUBCOMMANDS.items()]
    return ("usage: hybridpar SUBCOMMAND [ARGS...]   (hybridpar SUBCOMMAND --help: its flags and defaults)\n\n"
            "Plan, simulate, run and move hybrid-parallel training plans.\n\nsubcommands:\n" + "\n".join(lines))


def argv_for(sub: Subcommand, rest: Sequence[str]) -> list[str]:
    """The module's argv: the prefix flag takes the first word unless that word is a flag itself."""
    if sub.prefix and rest and not rest[0].startswith("-"):
        return [sub.prefix, *rest]
    if sub.prefix == "--list" and not rest:
        raise SpecError("list", "name what to list: models, clusters, planners, cost-models, evaluators or frameworks")
    return list(rest)


@one_line_errors()
def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        raise SpecError("subcommand", f"unknown {name!r}; choose from {', '.join(SUBCOMMANDS)}")
    sub = SUBCOMMANDS[name]
    module = importlib.import_module(sub.module)  # only the subcommand's packages (torch for run/profile)
    with invoked_as(f"hybridpar {name}"):
        return module.main(argv_for(sub, rest))


if __name__ == "__main__":
    sys.exit(main())
