"""Galvatron's own plan files (specs.galvatron_io) behind the framework interface."""
from __future__ import annotations

import json
from typing import Mapping

from frameworks.base import ExportResult, Framework, refuse_deepep, refuse_fp8, refuse_tp_overlap, register, with_model
from specs import ClusterSpec, ModelSpec, Plan, SpecError, plan_from_galvatron, plan_to_galvatron
from specs.reader import parse_json_text

PLAN_FILE = "galvatron_plan.json"


@register
class Galvatron(Framework):
    """Galvatron(-2)'s runtime: per-layer tp/Ulysses/cp, dp types (one of ddp/zero2, plus zero3), checkpointing."""

    name = "galvatron"
    file_names = (PLAN_FILE,)

    def export(self, plan: Plan, model: ModelSpec, cluster: ClusterSpec) -> ExportResult:
        refuse_fp8(plan, "Galvatron")
        refuse_tp_overlap(plan, "Galvatron")
        refuse_deepep(plan, "Galvatron")
        text = json.dumps(plan_to_galvatron(plan), indent=4) + "\n"
        return ExportResult(target=self.name, files={PLAN_FILE: text},
                            assumptions=("Galvatron's runtime and its model of the same architecture; its own "
                                         "optimizer and data settings",),
                            cannot_carry=("ZeRO-1, Megatron-SP, selective recompute, interleaving, expert "
                                          "parallelism, cp_comm all_gather and a cp token order other than "
                                          "zigzag (plans with them are refused)",))

    def import_(self, files: Mapping[str, str], model: ModelSpec, cluster: ClusterSpec) -> Plan:
        if PLAN_FILE not in files:
            raise SpecError("files", f"give {PLAN_FILE}")
        raw = parse_json_text(files[PLAN_FILE])  # the shared reader: its limits and one-line errors
        plan = with_model(plan_from_galvatron(raw, cluster.world_size), model, cluster)
        plan.validate(model, cluster)
        return plan
