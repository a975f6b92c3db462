"""Run Galvatron's own search engine (hetu-galvatron 2.4.0, C++ DP core) on a profile folder and
record what it prints: every search task's best plan with its time and memory, and the final choice.

Recipe (CPU only; docs/cost_models.md "Galvatron's engine"):
    pip download --no-deps --no-binary :all: hetu-galvatron==2.4.0 && tar xzf hetu_galvatron-2.4.0.tar.gz
    pip install pybind11 einops && pip install --no-deps --no-build-isolation ./hetu_galvatron-2.4.0
    PYTHONPATH=tools/galvatron_stubs python tools/galvatron_engine.py search --memory-gb 24 --batch 64
tools/galvatron_stubs holds import stand-ins for the CUDA-only modules (apex, amp_C) that
galvatron.core imports at load time; the search never calls them (a call raises).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import sys
import time
from pathlib import Path

LAYERS, HIDDEN, SEQ, HEADS = 32, 4096, 2048, 32
"""LLaMA-2 7B, as Galvatron's meta config llama2-7b.json and the profile files' names say."""


def engine_args(memory_gb: int, batch: int, log_dir: str, extra: list[str]):
    """Galvatron's own argument parser, with the settings its LLaMA-2 7B 36 GB plan was made with."""
    from galvatron.core.search_engine.arguments import galvatron_search_args
    parser = _llama_model_args()(galvatron_search_args(argparse.ArgumentParser()))
    argv = ["--num_nodes", "1", "--num_gpus_per_node", "8", "--memory_constraint", str(memory_gb),
            "--settle_bsz", str(batch), "--settle_chunk", "-1", "--max_tp_deg", "8", "--max_pp_deg", "8",
            "--sp_space", "tp+sp", "--sequence_parallel", "--default_dp_type", "zero2",
            "--pipeline_type", "pipedream_flush", "--mixed_precision", "bf16",
            "--time_profile_mode", "batch", "--memory_profile_mode", "static",
            "--hidden_size", str(HIDDEN), "--num_hidden_layers", str(LAYERS), "--num_attention_heads",
            str(HEADS), "--seq_length", str(SEQ), "--log_dir", log_dir, *extra]
    return parser.parse_args(argv), argv


def _llama_model_args():
    """galvatron/models/llama_hf/arguments.py, loaded alone (its package __init__ imports transformers)."""
    import importlib.util

    import galvatron
    path = Path(galvatron.__file__).parent / "models" / "llama_hf" / "arguments.py"
    spec = importlib.util.spec_from_file_location("galvatron_llama_args", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.model_args


def make_engine(folder: Path, memory_gb: float, batch: int, log_dir: str, extra: list[str]):
    from galvatron.core.search_engine.search_engine import GalvatronSearchEngine
    args, argv = engine_args(memory_gb, batch, log_dir, extra)
    for name in ("allreduce_bandwidth_config_path", "p2p_bandwidth_config_path", "overlap_coe_path",
                 "sp_time_path"):
        setattr(args, name, str(folder))
    Path(log_dir).mkdir(parents=True, exist_ok=True)
    args.output_config_path = log_dir  # its chosen plan file goes with the logs, not into the inputs
    engine = GalvatronSearchEngine(args)
    engine.set_model_layer_configs([{"hidden_size": HIDDEN, "layer_num": LAYERS, "seq_len": SEQ}])
    engine.set_path(str(folder))
    engine.set_model_name("llama2-7b")
    engine.mem_path = str(next(folder.glob("memory_profiling_bf16_*.json")))
    engine.time_path = str(next(folder.glob("computation_profiling_bf16_*.json")))
    return engine, argv


def _config(res: dict, bsz: int, chunk: int, pp_stage_dict: dict, vsp: int, embed_sdp: int) -> dict | None:
    """The plan of one task's result, in Galvatron's plan-file format (as save_results writes it)."""
    from galvatron.utils import array2str, strategy2config
    if res["min_pp_deg"] <= 0 or not isinstance(res["min_res_list"], list):
        return None
    strategies = [s for stage in res["min_res_list"] for s in stage]
    config = strategy2config(strategies)
    config.update(checkpoint=array2str([1 if s[-1].get("cpt") else 0 for s in strategies]), global_bsz=bsz,
                  chunks=chunk, pp_division=array2str(pp_stage_dict[res["min_pp_deg"]]),
                  pipeline_type="pipedream_flush", default_dp_type="zero2", vtp=int(res["vtp"]), vsp=vsp,
                  embed_sdp=embed_sdp)
    return config


def search(folder: Path, memory_gb: float, batch: int, log_dir: str, extra: list[str]) -> dict:
    """One full search; every (chunk, min_tp, max_tp, vsp, embed_sdp, sp_search) task's optimum kept."""
    engine, argv = make_engine(folder, memory_gb, batch, log_dir, extra)
    tasks: list[dict] = []
    original = engine.dynamic_programming

    def recording(strategies, bsz, chunk, mbsz_dict, pp_stage_dict, min_tp, max_tp, vsp, embed_sdp, sp_search, logger):
        res = original(strategies, bsz, chunk, mbsz_dict, pp_stage_dict, min_tp, max_tp, vsp, embed_sdp, sp_search, logger)
        config = _config(res, bsz, chunk, pp_stage_dict, vsp, embed_sdp)
        if config is not None:
            tasks.append({"context": {"min_tp": min_tp, "max_tp": max_tp, "sp_search": sp_search},
                          "config": config, "time_s": float(res["min_cost"]),
                          "stage_memory_mb": [float(m) for m in res["mem_cost"]]})
            with open(Path(log_dir) / f"tasks_{memory_gb}GB_bsz{batch}.jsonl", "a") as out:
                out.write(json.dumps(tasks[-1]) + "\n")  # progress survives an interrupted run
        return res

    engine.dynamic_programming = recording
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        engine.initialize_search_engine()
        start = time.perf_counter()
        engine.parallelism_optimization()
        wall = time.perf_counter() - start
    text = printed.getvalue()
    final = text[text.index("Final results"):] if "Final results" in text else "No valid configuration found."
    return {"memory_gb": memory_gb, "global_batch": batch, "argv": argv, "search_wall_s": wall,
            "final_printout": final.strip().splitlines()[:6], "chosen": _chosen(tasks), "tasks": tasks}


def _chosen(tasks: list[dict]) -> dict | None:
    """The engine's final choice: the task with the highest throughput (first one on ties, as it loops)."""
    best = None
    for t in tasks:
        if best is None or t["config"]["global_bsz"] / t["time_s"] > best["config"]["global_bsz"] / best["time_s"]:
            best = t
    return best


def _strategy(text: str) -> dict:
    """One entry of the engine's print_strategies line, e.g. '1-2*-4f-c-sp' (form_strategy)."""
    _, tp, rest = text.split("-", 2)
    parts = rest.split("-")
    return {"tp": int(tp.rstrip("*")), "fsdp": int("f" in parts[0]), "consec": 0 if "*" in parts[0] else 1,
            "cpt": int("c" in parts[1:]), "sp": int("sp" in parts[1:])}


def tasks_from_logs(folder: Path) -> list[dict]:
    """Every task optimum the engine logged (its per-task log files) in the search's order."""
    head = re.compile(r"\*{4}Searching with bsz=(\d+) chunk=(\d+) min_tp=(\d+) max_tp=(\d+) vsp=(\d+) "
                      r"embed_sdp=(\d+) sp_search=(\d+)")
    best = re.compile(r"\[Optimal pp_deg=(\d+)\] Minimized timecost=(\S+) .* Memory cost=\[(.*)\] Vocab tp=(\d+)")
    out = []
    for log in sorted(folder.glob("*/search_bsz*_chunk*/*.log")):
        lines, ctx = log.read_text().splitlines(), None
        for i, line in enumerate(lines):
            if m := head.match(line):
                ctx = [int(x) for x in m.groups()]
            elif (m := best.match(line)) and ctx:
                stages = [[_strategy(x.strip()) for x in st.split(",")] for st in lines[i + 2].split("||")]
                flat = [s for st in stages for s in st]
                def join(key, flat=flat):
                    return ",".join(str(s[key]) for s in flat)
                config = {"pp_deg": int(m.group(1)), "tp_sizes_enc": join("tp"), "tp_consecutive_flags": join("consec"),
                          "dp_types_enc": join("fsdp"), "use_sp": join("sp"), "checkpoint": join("cpt"),
                          "global_bsz": ctx[0], "chunks": ctx[1], "pp_division": ",".join(str(len(st)) for st in stages),
                          "pipeline_type": "pipedream_flush", "default_dp_type": "zero2", "vtp": int(m.group(4)),
                          "vsp": ctx[4], "embed_sdp": ctx[5]}
                out.append({"context": {"min_tp": ctx[2], "max_tp": ctx[3], "sp_search": ctx[6]}, "config": config,
                            "time_s": float(m.group(2)), "stage_memory_mb": [float(x) for x in m.group(3).split(",")]})
    return out


def collect(run_files: list[Path], partial: list[str]) -> dict:
    """One record of everything the engine printed: complete searches and interrupted ones."""
    from importlib.metadata import version

    import galvatron_dp_core  # noqa: F401  (fails here if the engine is not built)
    runs = [dict(r, complete=True) for f in run_files for r in json.loads(f.read_text())]
    for item in partial:
        gb, batch, folder = item.split(":", 2)
        tasks = tasks_from_logs(Path(folder))
        _, argv = engine_args(int(gb), int(batch), folder, [])
        logs = sorted(Path(folder).glob("*/search_bsz*_chunk*/*.log"), key=lambda f: f.stat().st_mtime)
        started = logs[0].stat().st_mtime if logs else 0.0  # end of the first task: a lower bound
        chunks = sorted({int(f.parent.name.rsplit("chunk", 1)[1]) for f in logs})
        runs.append({"memory_gb": int(gb), "global_batch": int(batch), "argv": argv, "complete": False,
                     "note": "search interrupted before its end; every task it finished, read from the engine's "
                             "own per-task logs; 'chosen' is the best of those (the final choice may be better)",
                     "chunks_started": chunks, "elapsed_s_at_interruption": logs[-1].stat().st_mtime - started if logs else 0.0,
                     "chosen": _chosen(tasks), "tasks": tasks})
    return {"engine": f"hetu-galvatron {version('hetu-galvatron')} (sdist, C++ dp core built here), CPU only",
            "date": time.strftime("%Y-%m-%d"), "recipe": __doc__.strip(),
            "command": "PYTHONPATH=tools/galvatron_stubs python tools/galvatron_engine.py search --folder "
                       "data/galvatron_llama2_7b --memory-gb GB --batch BATCH --out FILE (argv per run below)",
            "runs": sorted(runs, key=lambda r: (r["memory_gb"], r["global_batch"]))}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", choices=("search", "collect"),
                   help="search: run the engine; collect: merge search outputs (--runs) and the per-task logs "
                        "of interrupted searches (--partial-logs GB:BATCH:FOLDER) into one data file (--out)")
    p.add_argument("--folder", type=Path, default=Path("data/galvatron_llama2_7b"), help="Galvatron profile folder")
    p.add_argument("--memory-gb", type=int, nargs="+", default=[])
    p.add_argument("--runs", type=Path, nargs="*", default=[])
    p.add_argument("--partial-logs", nargs="*", default=[])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--log-dir", default="/tmp/galvatron_engine_logs")
    p.add_argument("--out", type=Path, help="write the JSON here (default: stdout)")
    p.add_argument("extra", nargs="*", help="more Galvatron arguments after --")
    args = p.parse_args(argv)
    if args.command == "collect":
        text = json.dumps(collect(args.runs, args.partial_logs), indent=1)
    else:
        text = json.dumps([search(args.folder, gb, args.batch, args.log_dir, args.extra) for gb in args.memory_gb],
                          indent=1)
    if args.out:
        args.out.write_text(text)
    else:
        sys.stdout.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
