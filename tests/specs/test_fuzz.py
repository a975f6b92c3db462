"""Broken inputs of every kind give one SpecError line, never a traceback from deep inside."""
import json

from hypothesis import given, settings
from hypothesis import strategies as st

import specs
from specs import Plan, SpecError, load_cluster, model_from_dict, uniform_plan
from specs.cluster import cluster_from_dict

JUNK = st.one_of(st.none(), st.booleans(), st.integers(-5, 0), st.floats(allow_nan=True),
                 st.text(max_size=4), st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=2), st.integers(), max_size=1))
MODEL_CONFIGS = [json.loads(p.read_text()) for p in sorted(specs.zoo.MODELS_DIR.glob("*.json"))]
CLUSTER = json.loads((specs.zoo.CLUSTERS_DIR / "titan-8.json").read_text())
PLAN = uniform_plan(4, tp=2, dp=2, pp=2, global_batch=8, micro_batches=2).to_dict()


def _mutate(raw: dict, data) -> dict:
    raw = json.loads(json.dumps(raw))
    target = raw
    key = data.draw(st.sampled_from(sorted(raw)))
    if isinstance(raw[key], dict) and raw[key] and data.draw(st.booleans()):
        target, key = raw[key], data.draw(st.sampled_from(sorted(raw[key])))
    elif isinstance(raw[key], list) and raw[key] and isinstance(raw[key][0], dict):
        target, key = raw[key][0], data.draw(st.sampled_from(sorted(raw[key][0]) or ["tp"]))
    if data.draw(st.booleans()):
        target.pop(key, None)
    else:
        target[key] = data.draw(JUNK)
    return raw


def _one_line(err: SpecError) -> None:
    assert "\n" not in str(err) and err.field


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(MODEL_CONFIGS), st.data())
def test_mutated_model_configs(raw, data):
    try:
        model = model_from_dict(_mutate(raw, data))
    except SpecError as err:
        _one_line(err)
    else:
        assert model.param_count() > 0


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_mutated_cluster_files(data):
    try:
        cluster_from_dict(_mutate(CLUSTER, data))
    except SpecError as err:
        _one_line(err)


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_mutated_plan_files(data):
    model = specs.load_model("tiny-gpt")
    try:
        Plan.from_dict(_mutate(PLAN, data)).validate(model, load_cluster("cpu-4"))
    except SpecError as err:
        _one_line(err)
