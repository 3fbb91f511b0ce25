"""zyfa_runtime.selfcheck: what it accepts to check (the checks themselves run in the GPU and
emulator tests)."""
import pytest

from zyfa_runtime.catalogue import all_variants
from zyfa_runtime.selfcheck import bounds, check_variant


@pytest.mark.parametrize("v", [v for v in all_variants() if v.serving][:4], ids=lambda v: v.name)
def test_serving_variants_are_refused_before_any_driver_use(v):
    """A plain call of a serving variant's shape runs the plain (or f16-math) kernel, so a check of
    it would compare another kernel with this one's model: refused, naming where they are tested
    (no driver is touched: None stands in for it)."""
    with pytest.raises(ValueError, match="serving variant.*test_gpu_serving_features"):
        check_variant(None, 0, v)


def test_every_plain_variant_has_finite_positive_bounds():
    for v in all_variants():
        if not v.serving:
            o, lse = bounds(v)
            assert 0 < o < 0.1 and 0 < lse < 0.1, v.name
