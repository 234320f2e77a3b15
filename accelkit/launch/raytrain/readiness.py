"""Checks made before any Ray Train worker starts, each failing with one line that names the fix."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import socket
import uuid
from pathlib import Path

from accelkit.errors import AccelkitError
from accelkit.launch.raytrain.job import RayJob

RAY_INSTALL_HINT = 'pip install "ray[train]" (or pip install "accelkit[ray]")'
VERSIONED = ("torch", "accelerate", "accelkit", "ray")
NODE_CHECK_TIMEOUT = 60.0  # seconds for every node to answer the version and storage check


def check_ray_installed() -> None:
    try:  # finding ray.train imports ray, which can fail on its own (a broken or partial install)
        found = importlib.util.find_spec("ray") is not None and importlib.util.find_spec("ray.train") is not None
    except ImportError:
        found = False
    if not found:
        raise AccelkitError("--ray needs Ray Train, which is not installed here", hint=RAY_INSTALL_HINT)


def check_address_reachable(address: str, timeout: float = 5.0) -> None:
    """HOST:PORT must accept a connection (Ray's own client would retry for a minute and print pages)."""
    if address == "auto" or address.startswith("ray://"):
        return
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise AccelkitError(f"--ray {address!r} is not HOST:PORT or auto",
                            hint="pass the head node's GCS address (e.g. 10.0.0.1:6379, what `ray start --head` "
                                 "printed) or `auto` on a machine of the cluster")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            return
    except socket.gaierror as exc:
        raise AccelkitError(f"cannot resolve the Ray head {host!r}: {exc.strerror}",
                            hint="pass the head node's IP address or a resolvable host name") from None
    except OSError as exc:
        raise AccelkitError(f"no Ray cluster answers at {address} ({exc.strerror or 'timed out'})",
                            hint="start it (`ray start --head --port PORT`) or pass the address `ray status` "
                                 "shows on the head node") from None


def check_resources(job: RayJob, total: dict[str, float], nodes: list[dict[str, float]]) -> None:
    """The cluster holds every worker: the sums, and each worker's share on some node."""
    for name, needed in job.needs().items():
        have = total.get(name, 0.0)
        if have < needed:
            per = job.resources_per_worker()[name]
            raise AccelkitError(f"the Ray cluster has {have:g} {name}s; {job.num_workers} workers x {per:g} need "
                                f"{needed:g}",
                                hint=f"pass --num-processes {int(have // per)}" if have >= per else
                                "add nodes to the cluster, or run with --cpu" if name == "GPU" else
                                "add nodes to the cluster")
    per_worker = job.resources_per_worker()
    if not any(all(node.get(name, 0.0) >= amount for name, amount in per_worker.items()) for node in nodes):
        raise AccelkitError(f"no node of the Ray cluster can hold one worker ({_resources_text(per_worker)})",
                            hint="lower --ray-cpus-per-worker")


def _resources_text(resources: dict[str, float]) -> str:
    return ", ".join(f"{amount:g} {name}" for name, amount in resources.items())


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def describe_node(cwd: str, probe_name: str, script: str | None) -> dict:
    """Runs on each node: its versions, whether it sees the driver's probe file in the working folder (the folder is
    shared), and the script's digest."""
    import importlib.metadata
    import os

    import ray

    versions = {}
    for name in VERSIONED:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    folder = Path(cwd)
    script_path = Path(script) if script else None
    return {"node": ray.util.get_node_ip_address(), "versions": versions, "cwd": folder.is_dir(),
            "shared": (folder / probe_name).is_file(),
            "script": file_digest(script_path) if script_path and script_path.is_file() else None,
            "python": os.sys.version.split()[0]}


@contextlib.contextmanager
def storage_probe(cwd: Path):
    """A file only this launch writes in the working folder, removed on the way out: a node that sees it shares it."""
    probe = cwd / f".accelkit-ray-probe-{uuid.uuid4().hex}"
    try:
        probe.write_text("accelkit --ray: a node that reads this shares the working folder\n")
    except OSError as exc:
        raise AccelkitError(f"cannot write in the working folder {cwd}: {exc.strerror}",
                            hint="run from a folder on shared storage that every node can read and write") from None
    try:
        yield probe.name
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()


def check_nodes(job: RayJob, answers: list[dict], here: dict) -> None:
    """Every node: the same versions as this machine, the working folder shared, the same script."""
    for answer in answers:
        node = answer["node"]
        for name in VERSIONED:
            if answer["versions"].get(name) != here["versions"].get(name):
                theirs = answer["versions"].get(name) or "not installed"
                raise AccelkitError(f"node {node} has {name} {theirs}; this machine has {here['versions'].get(name)}",
                                    hint=f"install the same {name} version on every node of the Ray cluster "
                                         "(a runtime_env or the cluster's image)")
        if not answer["cwd"]:
            raise AccelkitError(f"node {node} has no folder {job.cwd}",
                                hint="run from a folder on storage every node mounts at the same path")
        if not answer["shared"]:
            raise AccelkitError(f"node {node} does not share the working folder {job.cwd} (a file written here is "
                                "not there)", hint="run from a folder on shared storage (NFS, a mounted bucket): "
                                                   "checkpoints must be visible to every node to resume")
        if job.script_path and answer["script"] != here["script"]:
            state = "has no" if answer["script"] is None else "has another"
            raise AccelkitError(f"node {node} {state} {job.script_path}",
                                hint="put the script on storage every node shares")
