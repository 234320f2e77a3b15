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
MAX_SECONDS = 30 * 24 * 3600  # a watchdog, time-out or window longer than 30 days is a typo (an extra zero)
MAX_RESTARTS = 10_000  # restarts of one job: beyond this a crash loop, not resilience
MAX_MONITOR_INTERVAL = 3600.0  # seconds between two looks at the ranks
MAX_RAY_CPUS_PER_WORKER = 4096  # CPUs one Ray Train worker asks for (the largest machines have a few hundred)
MAX_STEPS = 10**9  # optimizer steps in a bench window (or its warm-up)
MAX_LAYERS = 10**5  # transformer layers (the deepest models have a few hundred)
MAX_WIDTH = 2**20  # hidden size, intermediate size, heads (the widest models are tens of thousands wide)
MAX_VOCAB = 2**24  # tokens in a vocabulary (the largest have a few hundred thousand)
MAX_MESSAGE_BYTES = 2**40  # one collective's message (1 TiB: more than any GPU holds)
