"""The GPU tests' outputs: device arrays poisoned before a call (NaN, so a row the kernel does
not write cannot pass), and the check after it against the fp64 reference and, for FP8, the
recipe's exact model (``selfcheck``'s bounds), or that a refused call left them untouched."""

import numpy as np

from tests.test_gpu import DRIVER

from zyfa_runtime.catalogue import Variant
from zyfa_runtime.memory import DeviceArray
from zyfa_runtime.selfcheck import MODEL_BOUNDS, RECIPE_FP64_BOUND, RECIPE_OF, _errors, bounds


def poisoned(shape, dtype):
    """A device array of all-ones bytes: NaN in bf16 and fp32 alike."""
    arr = DeviceArray(DRIVER, 0, shape, dtype)
    DRIVER.memset_d8(arr.ptr, 0xFF, arr.nbytes)
    return arr


def model_args(v: Variant, made):
    """The recipe model's arguments beside the quantised inputs ``made`` ((quantised, exact,
    descale) of Q, K and V): their descales and the kernel's fp32 softmax scale."""
    ds = {n: m[2] for n, m in zip(("descale_q", "descale_k", "descale_v"), made)}
    return dict(ds, softmax_scale=float(np.float32(1 / np.sqrt(v.d_qk))))


def check(v: Variant, out, lse, refused, run_ref):
    """Either the call was refused and the poisoned output is untouched, or out and lse are
    within the variant's bounds of the fp64 reference (``run_ref(None)``) and, FP8, of its
    recipe's model (``run_ref(recipe)``)."""
    if refused:
        assert np.isnan(out.numpy().astype(np.float64)).all(), "a refused call wrote its output"
        return
    ref_o, ref_lse = run_ref(None)
    o_err, lse_err = _errors(out, lse, ref_o, ref_lse)
    recipe = RECIPE_OF.get((v.arch, v.dtype))
    if recipe is None:
        o_bound, lse_bound = bounds(v)
        assert o_err <= o_bound and lse_err <= lse_bound, (o_err, lse_err)
        return
    assert o_err <= RECIPE_FP64_BOUND, o_err
    model_o, model_lse = run_ref(recipe)
    o_err, lse_err = _errors(out, lse, model_o, model_lse)
    assert o_err <= MODEL_BOUNDS[recipe][0] and lse_err <= MODEL_BOUNDS[recipe][1], (o_err, lse_err)
