"""Errors raised by the emulator."""

from __future__ import annotations

from zyfa_runtime.errors import ZyfaError


class EmulatorError(ZyfaError):
    """A kernel did something the emulator refuses to model (an unimplemented
    instruction, an access outside every allocation, a deadlock, ...).  The message
    names the instruction, its address and the wave."""


class UnsupportedInstruction(EmulatorError):
    """A decoded instruction without semantics in the emulator."""


def registry():
    """A handler table and its decorator: ``HANDLERS, handler = registry()``, then
    ``@handler("v_add_f32", ...)`` registers a function for those mnemonics."""
    handlers: dict = {}

    def handler(*names):
        def deco(fn):
            for n in names:
                handlers[n] = fn
            return fn
        return deco
    return handlers, handler
