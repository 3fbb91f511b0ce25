"""The serving features' plumbing, data-driven from catalogue.features: the arguments a kernel
takes for them (catalogue._arg_names), the values the planner fills in (plan.layout_of) and what
the C header says of them (the refusal of a call needing a feature its kernel lacks:
tests/test_kvcache.py)."""

import re

import numpy as np
import pytest

from tests.test_c_header import catalogue_manifest
from tests.test_validate import dense

from generator.c_header import write_header
from zyfa_runtime import catalogue, plan, validate
from zyfa_runtime.catalogue import Variant, all_variants, kernargs

#: The arguments each feature brings.
FEATURE_ARGS = {"window": {"window_left", "window_right"}, "softcap": {"softcap", "softcap_scale"},
                "sinks": {"sinks"}}


@pytest.mark.parametrize("v", all_variants(), ids=lambda v: v.name)
def test_a_kernel_takes_the_arguments_of_exactly_the_features_it_lists(v):
    names = [a.name for a in kernargs(v)]
    for feature, args in FEATURE_ARGS.items():
        assert (args <= set(names)) == (feature in catalogue.features(v)), (v.name, feature)
        assert not (args & set(names)) or args <= set(names)
    # sm_90a: the serving variants without the softcap, their softcap specialisations with it
    expected = {("gfx950", "bf16", False, False): ("window", "softcap", "sinks", "kvcache", "paged_kv"),
                ("gfx950", "fp8_e4m3", False, False): ("window", "softcap", "sinks", "kvcache", "paged_kv"),
                ("sm_90a", "bf16", True, False): ("window", "sinks", "kvcache", "paged_kv"),
                ("sm_90a", "fp8_e4m3", True, False): ("window", "sinks", "kvcache", "paged_kv"),
                ("sm_90a", "bf16", True, True): ("window", "softcap", "sinks", "kvcache", "paged_kv"),
                ("sm_90a", "fp8_e4m3", True, True): ("window", "softcap", "sinks", "kvcache", "paged_kv")}
    assert catalogue.features(v) == expected.get((v.arch, v.dtype, v.serving, v.softcap), ())
    end = kernargs(v)[-1]
    assert (end.offset + end.size) % 8 == 0, "a C struct of the arguments has no tail padding"


def problem(**kw):
    """A validated call of 40 queries over 70 keys, softmax_scale 0.125."""
    return validate.check_dense(**dense(sq=40, sk=70, dims=(64, 64), **{"softmax_scale": 0.125, **kw}))


NAMES = {a.name for a in kernargs(Variant("gfx950", "bf16", 64, 64, False))}


def test_the_planner_fills_the_window_bounds_and_the_softcap_with_its_fp32_ratio():
    got = plan._feature_values(problem(window_size=(5, 3), softcap=10.0), NAMES)
    assert got == {"window_left": 5, "window_right": 3, "softcap": 10.0,
                   "softcap_scale": float(np.float32(0.125 / 10.0))}
    # causal: the right bound is 0; a plain call: no bound, softcap off
    assert plan._feature_values(problem(causal=True, window_size=(7, -1)), NAMES) == \
        {"window_left": 7, "window_right": 0, "softcap": 0.0, "softcap_scale": 0.0}
    assert plan._feature_values(problem(), NAMES) == \
        {"window_left": -1, "window_right": -1, "softcap": 0.0, "softcap_scale": 0.0}
    # a window that cuts no key is none (window.reduce)
    assert plan._feature_values(problem(window_size=(69, 39)), NAMES)["window_left"] == -1
    # a kernel without the arguments gets none of them
    assert plan._feature_values(problem(window_size=(5, 3)), {"q", "softmax_scale"}) == {}


def test_the_c_header_states_each_feature_argument_where_a_kernel_has_it():
    manifest = catalogue_manifest()
    by_name = {v.name: v for v in all_variants()}
    for e in manifest["kernels"]:
        if catalogue.features(by_name[e["name"]]):
            e["features"] = list(catalogue.features(by_name[e["name"]]))   # as build.entry_for writes it
    h = write_header(manifest)
    for v in all_variants():
        has = {f: f in catalogue.features(v) for f in ("window", "softcap", "sinks")}
        assert (f"/* {v.name}: sliding window: query row i" in h) == has["window"]
        assert (f"/* {v.name}: softcap: 0 and 0 off" in h) == has["softcap"]
        assert (f"/* {v.name}: sinks: null, or fp32[hq]" in h) == has["sinks"]
        for f in ("window", "softcap", "sinks"):
            assert re.search(rf"^#define ZYFA_{v.name.upper()}_{f.upper()} +{int(has[f])}$", h, re.M), (v.name, f)
