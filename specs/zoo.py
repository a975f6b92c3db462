"""The model and cluster zoo: JSON files under specs/zoo/, looked up by name or by path."""
from __future__ import annotations

import re
from pathlib import Path

from specs.cluster import ClusterSpec, cluster_from_dict
from specs.errors import SpecError, load_json_with
from specs.hf_config import from_hf_config
from specs.model import ModelSpec

ZOO_DIR = Path(__file__).parent / "zoo"
MODELS_DIR = ZOO_DIR / "models"
CLUSTERS_DIR = ZOO_DIR / "clusters"


def model_names() -> list[str]:
    return sorted(p.stem for p in MODELS_DIR.glob("*.json"))


def cluster_names() -> list[str]:
    return sorted(p.stem for p in CLUSTERS_DIR.glob("*.json"))


def load_model(name_or_path: str | Path) -> ModelSpec:
    """A zoo model by name (``bert-huge-32``) or any Hugging Face style config.json path."""
    path = MODELS_DIR / f"{name_or_path}.json"
    if not path.exists():
        path = Path(name_or_path)
        if not path.exists():
            raise SpecError("model", f"{name_or_path!r} is neither a zoo model ({', '.join(model_names())}) "
                            "nor an existing file")
    return from_hf_config(path)


def load_cluster(name_or_path: str | Path) -> ClusterSpec:
    """A zoo cluster by name, optionally scaled by a node count (``dgx-a100-80g:64``), or a file."""
    text = str(name_or_path)
    base, colon, count = text.partition(":")
    path = CLUSTERS_DIR / f"{base}.json"
    if not path.exists():
        path = Path(base)
        if not path.exists():
            raise SpecError("cluster", f"{base!r} is neither a zoo cluster ({', '.join(cluster_names())}) "
                            "nor an existing file")
    cluster = load_json_with(path, lambda raw: cluster_from_dict(raw, name=path.stem))
    if cluster.calibration:
        from dataclasses import replace
        cluster = replace(cluster, calibration=str((path.parent / cluster.calibration).resolve()))
    if colon:
        if not re.fullmatch(r"[0-9]{1,9}", count) or int(count) <= 0:  # ASCII digits only (not '٣')
            raise SpecError("cluster", f"node count after ':' must be a positive integer, got {count!r}")
        cluster = cluster.with_nodes(int(count))
    return cluster
