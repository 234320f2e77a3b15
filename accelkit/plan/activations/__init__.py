"""Activations: what a forward keeps for the backward, counted (count.py) on real runs and on meta-device traces
(trace.py, emulate.py), with the textbook formula as a fallback (formula.py)."""
