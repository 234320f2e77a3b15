"""Measuring what ranks really hold (probe.py, holdings.py) and comparing it with the plan (compare.py,
measuring.py)."""
