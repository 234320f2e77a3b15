"""Before any rank starts, every node of a cluster job checks that all nodes are about to run the same thing.

Each node publishes on the job board (job_board.py) what it would run: the versions of Python, torch,
accelerate, transformers, deepspeed and accelkit, the script's sha256, the config's hash and the world size; when
every node has published, each compares them with machine 0's. A difference (a node with an older copy of the
script, another torch, a different config) stops the job within seconds with one line naming the nodes and what
differs, instead of a hang in the first collective or silently different training on some ranks.

On a job of several machines, also before any rank starts (accelkit.launch.cluster.network_checks):
- machine 0's address must not be a loopback address unless every node is on machine 0's own network (the same
  host and network namespace);
- every node must reach machine 0's rendezvous port (machine 0 listens on it for the check);
- a job whose checkpoints are sharded (FSDP, DeepSpeed) must run in a working directory every node shares: each
  node writes a marker there and reads the others'.
Standard library only: nothing here imports torch (versions come from the installed packages' metadata).
"""

from __future__ import annotations

import hashlib
import json
import platform
from importlib import metadata
from pathlib import Path
from typing import Any

from accelkit.errors import AccelkitError
from accelkit.launch.cluster.job_board import wait_for_all
from accelkit.launch.preflight import module_script
from accelkit.launch.request import LaunchRequest

PACKAGES = ("torch", "accelerate", "transformers", "deepspeed")
WAIT_FOR_NODES = 300.0  # seconds for every node to publish (nodes of one srun start within seconds)
PREFIX = "preflight/"


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def _sha256(path: Path | None) -> str:
    if path is None or not path.is_file():
        return "not a file here"
    return hashlib.sha256(path.read_bytes()).hexdigest()


def node_facts(request: LaunchRequest, cwd: Path | None = None) -> dict[str, str]:
    """What this node is about to run, as comparable text."""
    import accelkit

    cwd = cwd or Path.cwd()
    target = request.target
    script = module_script(target.script, cwd) if target.module else cwd / target.script
    # The config as the request states it (options, and the bytes of any --config file) minus this node's own values.
    options = request.options.to_json_dict()
    for own in ("machine_rank", "main_process_ip", "main_process_port"):
        options.pop(own, None)
    config = json.dumps(options, sort_keys=True).encode()
    if request.config_file is not None and request.config_file.is_file():
        config += request.config_file.read_bytes()
    facts = {"python": platform.python_version(), "accelkit": accelkit.__version__}
    facts.update({package: _version(package) for package in PACKAGES})
    facts["script sha256"] = _sha256(script)
    facts["config hash"] = hashlib.sha256(config).hexdigest()
    facts["world size"] = str(request.options.num_processes)
    return facts


def differences(published: dict[int, dict[str, Any]]) -> list[str]:
    """`published`: machine -> {"node", "facts"}. One phrase per fact that differs from machine 0's."""
    base = published[0]
    out = []
    for key, value in base["facts"].items():
        others = [(machine, entry) for machine, entry in sorted(published.items())
                  if entry["facts"].get(key) != value]
        if not others:
            continue
        shown = [f"{base['node']} (machine 0) has {_short(value)}"]
        shown += [f"{entry['node']} (machine {machine}) has {_short(entry['facts'].get(key))}"
                  for machine, entry in others]
        out.append(f"{key}: " + ", ".join(shown))
    return out


def _short(value: Any) -> str:
    text = str(value)
    return text[:12] if len(text) == 64 else text  # a sha256 reads fine by its first 12 hex digits


def check_nodes(board, request: LaunchRequest, *, machine: int, machines: int, node: str,
                timeout: float = WAIT_FOR_NODES, main_address: str | None = None, port: int | None = None,
                shared_dir: Path | None = None) -> None:
    """Publish this node's facts, wait for every node's, and raise when any differs from machine 0's. With
    `main_address` and `port` (a job of several machines), then check the network and, with `shared_dir`, that the
    directory is shared (accelkit.launch.cluster.network_checks)."""
    from accelkit.launch.cluster.network_checks import NetworkChecks

    checks = NetworkChecks(machine=machine, machines=machines, node=node, main_address=main_address, port=port,
                           shared_dir=shared_dir)
    with checks:
        board.put(f"{PREFIX}{machine}", {"node": node, "facts": node_facts(request), **checks.published()})
        published = wait_for_all(board, PREFIX, machines, timeout)
        checks.check_addresses(published)
        found = differences(published)
        if found:
            raise AccelkitError("the nodes would not run the same job: " + "; ".join(found),
                                hint="give every node the same files and environment (a shared file system or one "
                                     "container image); nothing was started")
        checks.run(board, published, timeout)
