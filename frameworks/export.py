"""hybridpar export / import (or python -m frameworks.export): a Plan JSON to a framework's files
(--to T PLAN.json), or a framework's files back to a Plan JSON (--from T FILE...), for a model and
a cluster. Megatron's flags may be given directly: --from megatron ... -- --tensor-model-parallel-size 4 ..."""
from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Sequence

from frameworks import available, get
from frameworks.base import Framework
from specs import ClusterSpec, ModelSpec, Plan, SpecError, load_cluster, load_model
from specs.cli import ArgumentParser, output_dir
from specs.embedded import plan_cluster, plan_model, read_plan, with_specs
from specs.errors import one_line_errors
from specs.hf_config import from_hf_config
from specs.zoo import MODELS_DIR


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="python -m frameworks.export", description=__doc__)
    way = p.add_mutually_exclusive_group(required=True)
    way.add_argument("--to", choices=available(), help="export PLAN.json to this framework's files")
    way.add_argument("--from", dest="source", choices=available(), help="import this framework's FILEs to a plan")
    p.add_argument("files", nargs="*", type=Path, help="--to: one plan JSON; --from: the framework's files "
                   "(named as the export names them, e.g. torchtitan.toml, megatron_args.txt, ds_config.json), "
                   "or, for megatron, its flags after --")
    p.add_argument("--model", help="zoo model or config.json (--to: default the plan's model)")
    p.add_argument("--cluster", help="zoo cluster (name:nodes) or file (--to: default the plan's cluster)")
    p.add_argument("--out", type=Path, help="--to: folder for the files and NOTES.md (else printed); "
                   "--from: the plan JSON to write (else printed)")
    return p


def load_model_at(name: str, seq_length: int | None) -> ModelSpec:
    """A zoo model or config.json, at ``seq_length`` when a framework file sets one."""
    if seq_length is None:
        return load_model(name)
    path = MODELS_DIR / f"{name}.json"
    return from_hf_config(path if path.exists() else Path(name), seq_length=seq_length)


def read_files(framework: Framework, paths: Sequence[Path]) -> dict[str, str]:
    """{export file name: text}; a file whose name the framework does not know is taken by suffix."""
    out = {}
    for path in paths:
        name = path.name if path.name in framework.file_names else _by_suffix(framework, path)
        out[name] = path.read_text(encoding="utf-8")
    return out


def _by_suffix(framework: Framework, path: Path) -> str:
    for name in framework.file_names:
        if Path(name).suffix == path.suffix:
            return name
    raise SpecError("files", f"{path.name}: {framework.name} reads {', '.join(framework.file_names)}")


def import_files(target: str, paths: Sequence[Path], model: str, cluster: str,
                 command_line: Sequence[str] = ()) -> tuple[Plan, ModelSpec, ClusterSpec]:
    """The Plan the files (or the framework's flags, ``command_line``) describe, with the model
    (at their sequence length) and cluster."""
    framework = get(target)
    files = read_files(framework, paths)
    if command_line:
        if framework.command_line_file is None:
            raise SpecError("--", f"{target} takes files, not flags after --")
        files[framework.command_line_file] = shlex.join(command_line)
    if not files:
        raise SpecError("files", f"--from {target} needs its files ({', '.join(framework.file_names)})"
                        + (" or its flags after --" if framework.command_line_file else ""))
    spec, cl = load_model_at(model, framework.seq_length(files)), load_cluster(cluster)
    return framework.import_(files, spec, cl), spec, cl


@one_line_errors()
def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    flags = argv[cut + 1:]  # the framework's own command line, read by its importer, not here
    args = build_parser().parse_args(argv[:cut])
    if args.to:
        if flags:
            raise SpecError("--", "flags after -- are for --from (a framework's command line)")
        if len(args.files) != 1:
            raise SpecError("files", f"--to takes one plan JSON, got {len(args.files)} files")
        plan = read_plan(args.files[0])
        model, cluster = plan_model(plan, args.model), plan_cluster(plan, args.cluster)
        plan.validate(model, cluster)
        result = get(args.to).export(plan, model, cluster)
        if args.out:
            output_dir(args.out, "--out")
            for path in result.write(args.out):
                print(path)
        else:
            for name, text in {**result.files, "NOTES.md": result.notes()}.items():
                print(f"# --- {name}\n{text}")
        return 0
    if not args.model or not args.cluster:
        raise SpecError("--from", "needs --model and --cluster (the files name neither exactly)")
    plan, model, cluster = import_files(args.source, args.files, args.model, args.cluster, flags)
    plan = with_specs(plan, model, cluster)  # the file then loads anywhere, as compare's plans do
    if args.out:
        plan.save(args.out)
    print(plan.to_json() if not args.out else plan.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
