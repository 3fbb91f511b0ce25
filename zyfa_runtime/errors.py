"""Exceptions raised by the zyfa runtime."""

from __future__ import annotations


class ZyfaError(RuntimeError):
    """A failure in the runtime or in a GPU driver call.

    ``code`` and ``name`` are the driver's numeric error and its symbolic name
    (``CUDA_ERROR_INVALID_IMAGE``, ``hipErrorInvalidImage``) when the error came
    from a driver call, ``call`` the driver function that failed, and ``message``
    the human-readable description.
    """

    def __init__(self, message: str, *, code: int | None = None, name: str | None = None,
                 call: str | None = None) -> None:
        self.message = message
        self.code = code
        self.name = name
        self.call = call
        super().__init__(str(self))

    def __str__(self) -> str:
        head = f"{self.call} failed: " if self.call else ""
        if self.name is not None and self.code is not None:
            head += f"{self.name} ({self.code}): "
        elif self.code is not None:
            head += f"error {self.code}: "
        return head + self.message

    def __reduce__(self):
        return (_rebuild, (type(self), self.message, self.code, self.name, self.call))


class CodeObjectError(ZyfaError):
    """A code object or the manifest is missing, malformed or fails its integrity check."""


class InstallationError(ZyfaError):
    """The installed kernels do not fit this machine or this runtime: a driver or toolkit
    older or other than the one the code objects are pinned to, a device arch they were not
    built for, or a manifest from another zyfa version (``versions.py``)."""


def _rebuild(cls, message, code, name, call):
    return cls(message, code=code, name=name, call=call)
