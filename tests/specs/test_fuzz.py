"""Broken inputs through the file readers and the CLIs' entry functions (in-process): each mutated
input either gives the one-line error naming a field, or is a valid input (re-validated: the model
builds, the plan passes an independent runnability check, the CLI prints finite JSON). An input
broken by construction (benchmarks.fuzz_mutations labels them) that is accepted fails the test."""
import random
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks import fuzz_classes, fuzz_inputs
from benchmarks.fuzz_mutations import Format, byte_level, structural
from specs import SpecError
from specs.reader import parse_json_bytes

SEEDS = fuzz_inputs.seeds()
FAST_TARGETS = [t for t in fuzz_inputs.TARGETS if t != "executor.run"]  # that one trains for real


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(target=st.sampled_from(FAST_TARGETS), rng=st.randoms(use_true_random=False))
def test_every_mutant_is_a_clear_error_or_a_valid_input(target, rng):
    with tempfile.TemporaryDirectory() as tmp:
        run, garbage, what = fuzz_inputs.TARGETS[target](SEEDS, Path(tmp), rng)
        outcome, detail = fuzz_inputs.classify(run, garbage, limit_s=60)
    assert outcome in ("error", "valid"), f"{target}: {outcome} for {what}: {detail}"


ALWAYS_BROKEN = {"galvatron structure", "non-regular file", "galvatron as plan"}
"""Targets whose every case is broken by construction."""


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(target=st.sampled_from(sorted(fuzz_classes.TARGETS)), rng=st.randoms(use_true_random=False))
def test_the_new_input_classes_are_clear_errors_or_valid(target, rng):
    """Non-finite-making numbers, Galvatron folder structures, widths past their limits, FIFOs and
    devices, a Galvatron plan as a plan: never a traceback, a hang or accepted garbage."""
    with tempfile.TemporaryDirectory() as tmp:
        run, garbage, what = fuzz_classes.TARGETS[target](SEEDS, Path(tmp), rng)
        outcome, detail = fuzz_inputs.classify(run, garbage, limit_s=60)
    assert outcome in ("error", "valid"), f"{target}: {outcome} for {what}: {detail}"


@pytest.mark.slow
def test_a_thousand_cases_of_the_new_classes():
    counts, problems = fuzz_inputs.fuzz(1000, seed=3, limit_s=60, only=sorted(fuzz_classes.TARGETS))
    assert not problems, problems[:5]


@pytest.mark.parametrize("target", FAST_TARGETS)
def test_each_target_rejects_and_accepts_something(target):
    """The property above is not vacuous: over 40 seeded cases each target both rejects broken
    inputs and accepts valid ones (only rejects, for targets broken by construction)."""
    rng, seen = random.Random(7), set()
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(40):
            folder = Path(tmp) / str(i)
            folder.mkdir()
            run, garbage, _ = fuzz_inputs.TARGETS[target](SEEDS, folder, rng)
            seen.add(fuzz_inputs.classify(run, garbage, limit_s=60)[0])
    assert seen == ({"error"} if target in ALWAYS_BROKEN else {"error", "valid"})


@settings(max_examples=100, deadline=None)
@given(raw=st.sampled_from(SEEDS["models"] + SEEDS["clusters"] + SEEDS["plans"]), rng=st.randoms(use_true_random=False))
def test_broken_bytes_never_parse(raw, rng):
    data, garbage, what = byte_level(raw, rng)
    try:
        parse_json_bytes(data)
    except SpecError as err:
        assert "\n" not in str(err) and err.field, what
    else:
        assert not garbage, f"accepted: {what}"


@settings(max_examples=100, deadline=None)
@given(raw=st.sampled_from(SEEDS["clusters"]), rng=st.randoms(use_true_random=False))
def test_a_wrong_type_names_the_mutated_field(raw, rng):
    from specs.cluster import cluster_from_dict
    doc, garbage, what = structural(raw, Format(), rng)
    try:
        cluster_from_dict(doc)
    except SpecError as err:
        assert "\n" not in str(err)
        if " = " in what and garbage:  # a field set to junk: the error names that field
            assert err.field.split(".")[-1] in what, (err.field, what)
    else:
        assert not garbage, f"accepted: {what}"
