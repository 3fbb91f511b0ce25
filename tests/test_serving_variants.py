"""The serving variants (catalogue.Variant.serving): which kernel a call takes.  A call that needs
a window, a softcap or sinks runs the serving variant of its (arch, dtype, head dims, causal)
where the manifest lists one -- sm_90a, whose plain kernels stay as tuned -- and every other
call the plain variant (gfx950 BF16's plain kernels take the features themselves)."""

import functools

import pytest

from tests.test_c_header import catalogue_manifest
from tests.test_validate import dense, ref

from zyfa_runtime import catalogue, plan, validate
from zyfa_runtime.catalogue import Variant


class Table:
    """The lookups of kernels.KernelTable the planner's variant choice makes, over a manifest
    (entries by their variant, ``features`` as build.entry_for writes them)."""

    def __init__(self, manifest: dict):
        self._entries = {Variant.from_json(e["variant"]): e for e in manifest["kernels"]}

    def entry(self, v: Variant) -> dict | None:
        return self._entries.get(v)

    def available(self, arch: str) -> list[Variant]:
        return sorted(v for v, e in self._entries.items() if v.arch == arch and e.get("built"))


@functools.cache
def table(with_serving: bool = True) -> Table:
    m = catalogue_manifest()
    m["kernels"] = [dict(e, **({"features": list(catalogue.features(Variant.from_json(e["variant"])))}
                              if catalogue.features(Variant.from_json(e["variant"])) else {}))
                    for e in m["kernels"] if with_serving or "_serving" not in e["name"]]
    return Table(m)


def problem(dtype="bf16", dims=(128, 128), **kw):
    """40 queries over 70 keys."""
    return validate.check_dense(**dense(dtype=dtype, sq=40, sk=70, dims=dims, **kw))


#: (call options, whether it needs a feature): a window that cuts no key is none (window.reduce).
CALLS = [
    ({}, False),
    (dict(causal=True), False),
    (dict(window_size=(69, 39)), False),
    (dict(window_size=(16, -1)), True),
    (dict(causal=True, window_size=(16, -1)), True),
    (dict(window_size=(-1, 3)), True),
    (dict(softcap=30.0), True),
    (dict(sinks=ref((4,), "float32", 9)), True),
]


@pytest.mark.parametrize("dims", [d if d == (128, 128) else pytest.param(d, marks=pytest.mark.slow)
                                  for d in catalogue.HEAD_DIMS], ids=lambda d: f"d{d[0]}x{d[1]}")
@pytest.mark.parametrize("options,needs", CALLS, ids=lambda x: repr(x) if isinstance(x, dict) else None)
def test_a_call_takes_the_serving_variant_exactly_where_it_needs_a_feature(options, needs, dims):
    p = problem(dims=dims, **options)
    assert bool(validate.features_of(p)) == needs
    causal = options.get("causal", False)
    plain = Variant("sm_90a", "bf16", *dims, causal)
    got = plan.variant_for(p, table(), "sm_90a")
    # a softcap: the serving variant's softcap specialisation (the serving kernel has none)
    capped = "softcap" in options
    assert got == (catalogue.serving_variant(plain, softcap=capped) if needs else plain)
    plan.require_features(p, table(), got)    # the variant taken implements what the call needs
    if capped:
        with pytest.raises(ValueError, match="_serving does not implement softcap"):
            plan.require_features(p, table(), catalogue.serving_variant(plain))
    # gfx950 BF16 has no serving variants: its plain kernels take the features
    gfx = plan.variant_for(p, table(), "gfx950")
    assert gfx == Variant("gfx950", "bf16", *dims, causal)
    plan.require_features(p, table(), gfx)


def test_without_serving_kernels_in_the_manifest_a_feature_call_is_refused_by_the_plain_one():
    """A manifest of before the serving variants (or one that lacks them) keeps the plain
    variant, whose entry lists no feature: the call is refused naming it, before any launch."""
    p = problem(window_size=(16, -1))
    old = table(with_serving=False)
    got = plan.variant_for(p, old, "sm_90a")
    assert got == Variant("sm_90a", "bf16", 128, 128, False)
    with pytest.raises(ValueError, match="fwd_sm_90a_bf16_d128x128_full does not implement a sliding window"):
        plan.require_features(p, old, got)


def test_an_sm90a_fp8_call_takes_its_serving_variant_where_it_needs_a_feature():
    for options, needs in CALLS:
        p = problem(dtype="fp8_e4m3", **options)
        plain = Variant("sm_90a", "fp8_e4m3", 128, 128, options.get("causal", False))
        got = plan.variant_for(p, table(), "sm_90a")
        # without a feature, 70 keys take the f16-math variant (catalogue.Variant.f16)
        assert got == (catalogue.serving_variant(plain, softcap="softcap" in options) if needs
                       else catalogue.f16_variant(plain))
        plan.require_features(p, table(), got)
