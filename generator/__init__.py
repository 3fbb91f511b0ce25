"""Kernel source generation and code-object tooling used by build.py (not needed at run time)."""
