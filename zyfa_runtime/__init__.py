"""zyfa: ahead-of-time FP8/BF16 attention-prefill kernels and a framework-free runtime."""

__version__ = "0.1.0"

from .api import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache  # noqa: E402
from .errors import CodeObjectError, InstallationError, ZyfaError  # noqa: E402
from .memory import DeviceArray  # noqa: E402
from .merge import merge_attention_states  # noqa: E402
from .quantize import QuantizedFP8, quantize_fp8  # noqa: E402
from .tensors import TensorRef, as_tensor  # noqa: E402

__all__ = ["flash_attn_func", "flash_attn_varlen_func", "flash_attn_with_kvcache", "merge_attention_states",
           "quantize_fp8", "QuantizedFP8",
           "TensorRef", "as_tensor",
           "DeviceArray", "ZyfaError", "CodeObjectError", "InstallationError", "__version__"]
