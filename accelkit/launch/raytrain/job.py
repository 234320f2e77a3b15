"""What a Ray Train job of `accelkit launch --ray` runs, as plain data that crosses to every worker (pickled by Ray).

One Ray Train worker per rank. Each worker starts its rank as a child process: `python [-m accelkit.ranks.bootstrap]
SCRIPT ARGS` in the user's working folder with the user's environment plus what Accelerate's launcher would set for
the config (accelkit.launch.raytrain.rank_env). A child process, not the script run inside the worker, because the
script then owns a real main thread (signal handlers, sys.exit, faulthandler) exactly as under torchrun.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

# Ray's, the scheduler's, this shell's and this machine's own: never handed from the driver to a worker on another
# node, which keeps its own (its Python environment, its libraries, its network interfaces, its devices).
NODE_LOCAL_ENV = frozenset({
    "CUDA_VISIBLE_DEVICES", "HOSTNAME", "PWD", "OLDPWD", "SHLVL", "_", "TMPDIR", "DISPLAY", "SSH_AUTH_SOCK",
    "SSH_CONNECTION", "SSH_CLIENT", "SSH_TTY", "TERM_SESSION_ID", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE",
    "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK", "ROLE_RANK", "PATH", "LD_LIBRARY_PATH", "HOME",
    "USER", "LOGNAME", "SHELL", "VIRTUAL_ENV", "CONDA_PREFIX", "CONDA_DEFAULT_ENV", "PYTHONHOME",
    "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME",
})
NODE_LOCAL_PREFIXES = ("RAY_", "TORCHELASTIC_", "SLURM_", "PMI_", "OMPI_")
DEFAULT_CPUS_PER_WORKER = 1


@dataclass(frozen=True)
class RayOptions:
    """`--ray ADDRESS` and its companions, as given on the command line."""

    address: str  # host:port of the cluster's GCS, or "auto" (the cluster this machine belongs to)
    storage: Path | None = None  # Ray Train's run storage (RunConfig.storage_path); None: Ray's default
    cpus_per_worker: int = DEFAULT_CPUS_PER_WORKER


@dataclass(frozen=True)
class RayJob:
    """Everything the driver hands to Ray Train and every worker needs."""

    address: str
    num_workers: int
    use_gpu: bool
    cpus_per_worker: int
    max_failures: int  # FailureConfig(max_failures): restarts of the whole worker group
    storage: str | None
    name: str
    rank_argv: tuple[str, ...]  # after the Python interpreter: ("-m", bootstrap, script, args...) or (script, ...)
    cwd: str
    env: dict[str, str] = field(default_factory=dict)  # the user's environment plus Accelerate's for the config
    script_path: str | None = None  # the script file (absolute), whose content every node must have the same

    def resources_per_worker(self) -> dict[str, float]:
        resources: dict[str, float] = {"CPU": float(self.cpus_per_worker)}
        if self.use_gpu:
            resources["GPU"] = 1.0
        return resources

    def needs(self) -> dict[str, float]:
        """The resources the whole job asks of the cluster."""
        return {name: amount * self.num_workers for name, amount in self.resources_per_worker().items()}


def user_environment(environ: dict[str, str]) -> dict[str, str]:
    """The driver's environment minus what belongs to this machine, this shell or a scheduler."""
    return {name: value for name, value in environ.items()
            if name not in NODE_LOCAL_ENV and not name.startswith(NODE_LOCAL_PREFIXES)}
