"""A restarted group's ranks meet under store keys of their own rendezvous round.

torchrun's agent hands every attempt of a restarted group (`--max-restarts`) the same store (its own, at
MASTER_ADDR:MASTER_PORT, TORCHELASTIC_USE_AGENT_STORE=True), and torch 2.13 no longer prefixes the ranks' keys with
the attempt: a restarted rank can read a dead rank's address from the attempt before and fail ("Gloo
connectFullMesh failed ... Connection refused"), or not, depending on which rank starts first. In a restarted
attempt only (rendezvous round $ACCELKIT_RENDEZVOUS_ROUND > 0), an `init_process_group` that would rendezvous through
the environment gets that store with the round as a key prefix, as older torch versions did. A first attempt, and a
launch without torchrun's agent store, are left exactly as they are.

The round is the c10d rendezvous's own (accelkit.launch.restarts reads it from the agent's log as the agent joins
it, before it starts the ranks), not a count kept by each agent: every machine joins the same round, whether its own
rank failed (a restart torchrun counts, TORCHELASTIC_RESTART_COUNT) or another machine's did (a membership change,
which torchrun does not count), so the ranks of every machine look for each other under the same keys.
"""

from __future__ import annotations

import functools
import os

RENDEZVOUS_ROUND_ENV = "ACCELKIT_RENDEZVOUS_ROUND"


def rendezvous_round() -> int:
    """The rendezvous round this rank's group runs in: 0 for the first attempt, one more for each restart."""
    value = os.environ.get(RENDEZVOUS_ROUND_ENV, "0")
    return int(value) if value.isdigit() else 0


def install() -> None:
    if rendezvous_round() == 0 or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return
    from accelkit.ranks.probes import after_import

    after_import("torch", _patch)  # torch.distributed is complete once torch is


def _patch() -> None:
    import torch.distributed as dist

    original = dist.init_process_group
    if getattr(original, "_accelkit_attempt_store", False):
        return

    @functools.wraps(original)
    def init_process_group(*args, **kwargs):
        init_method = kwargs.get("init_method")
        if kwargs.get("store") is None and init_method in (None, "env://") and len(args) <= 1:
            from datetime import timedelta

            timeout = kwargs.get("timeout") or timedelta(minutes=10)
            world_size = int(os.environ["WORLD_SIZE"])
            store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size,
                                  is_master=False, timeout=timeout)
            kwargs.pop("init_method", None)
            kwargs.update(store=dist.PrefixStore(f"accelkit/round_{rendezvous_round()}", store),
                          rank=int(os.environ["RANK"]), world_size=world_size)
        return original(*args, **kwargs)

    init_process_group._accelkit_attempt_store = True
    dist.init_process_group = init_process_group
