"""Ceilings on sizes and counts a real machine or scheduler could meet. Beyond them a value is a typo (an extra zero,
a missing unit), not a request: every command refuses it in one line naming the ceiling, instead of writing a config
or a plan for a machine that cannot exist."""

from __future__ import annotations

MAX_PROCESSES = 2**20  # processes (GPUs) in one job; the largest clusters have a few hundred thousand GPUs
MAX_MACHINES = 2**20  # machines in one job
MAX_PARAMS = 10**13  # the largest models trained so far have a few trillion parameters
MAX_ACCUMULATION_STEPS = 2**20  # gradient accumulation steps: beyond this one optimizer step would take days
MAX_SEQ_LEN = 2**27  # tokens per sample: the longest contexts trained are a few million
MAX_BATCH = 2**30  # samples per step (micro or global batch)
