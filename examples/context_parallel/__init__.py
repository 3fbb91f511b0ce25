"""Context-parallel causal prefill: a ring of zyfa calls over N ranks (README.md)."""
