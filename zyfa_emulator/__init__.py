"""A CPU emulator of wave64 CDNA4 (gfx950) execution that runs real gfx950 code objects.

``EmulatorDriver`` (``ZYFA_BACKEND=emulator``) plugs it into the runtime; ``Machine``,
``LoadedCode`` and ``CodeObject`` are the pieces underneath (see docs in each module).
Semantics follow AMD's CDNA4 ISA reference guide; nothing here depends on the build
side of the project.
"""

__version__ = "0.1.0"

from .codeobject import CodeObject, CodeObjectFormatError, KernelDescriptor  # noqa: E402
from .errors import EmulatorError, UnsupportedInstruction  # noqa: E402
from .machine import Config, LoadedCode, Machine  # noqa: E402

__all__ = ["CodeObject", "CodeObjectFormatError", "KernelDescriptor", "EmulatorError",
           "UnsupportedInstruction", "Config", "LoadedCode", "Machine", "__version__"]
