"""A real Slurm cluster on this host for the tests: munged, slurmctld and two slurmd "nodes" (n1, n2).

Debian's slurm-wlm is built with multiple-slurmd support, so two slurmd daemons on one host act as two nodes:
`NodeName=n1`/`n2`, both `NodeAddr=127.0.0.1` with distinct ports. With `network=True` each node is instead its
own Linux network namespace (tests/helpers/netns.py: its own loopback, an `eth0` with its own address on a bridge,
`NodeAddr` that address), its slurmd started inside with nsenter, and slurmctld listens on the bridge's address:
the nodes then talk across a network as separate machines do, while the host name still resolves to 127.0.0.1 and
the filesystem stays shared (like a cluster's home). The node names do not resolve (nothing edits
/etc/hosts), as on clusters whose node names are not host names. Everything lives in one folder: the config, a
fresh munge key and socket, state, spool and logs. Daemons are started in the foreground (-D / --foreground) so the
PID we hold is the daemon's, and stopped by those PIDs only (other processes on a shared machine are never touched).

    with SlurmCluster(tmp_dir) as cluster:
        proc = cluster.sbatch_wait(script)       # sbatch --wait, with SLURM_CONF pointing at the cluster

Standalone (to try things by hand): `python tests/helpers/slurm.py DIR [GPUS] [--network]` starts a cluster and
prints the environment to use, until Ctrl-C.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

try:
    from helpers.netns import NetworkNamespaces
except ImportError:  # run as a script (python tests/helpers/slurm.py DIR): this folder is on sys.path
    from netns import NetworkNamespaces

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "srun", "sinfo", "squeue", "scontrol", "scancel")
NODES = ("n1", "n2")
# Each node declares this machine's own CPUs and memory (the nodes share them, as multiple-slurmd nodes do), and
# task/affinity binds every step to the CPUs it was granted: a job that asks for too few CPUs gets too few, as on a
# real cluster (with task/none every rank would see the whole machine and the mistake would pass unseen).
CPUS_PER_NODE = len(os.sched_getaffinity(0))
MEMORY_MIB_PER_NODE = int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") * 0.9) // 2**20  # slurmd's own
DEF_MEM_PER_CPU_MIB = 1024  # what a job that names no memory gets per CPU, as many clusters set it
INSTALL_HINT = ("Slurm is not installed: the Slurm tests need Debian's slurm-wlm and munge "
                "(`apt-get install -y slurm-wlm munge`, as .ci/run does)")


def missing_binaries() -> list[str]:
    return [name for name in (*DAEMONS, *CLIENTS)
            if shutil.which(name) is None and not Path("/usr/sbin", name).exists()]


def _binary(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


def _free_ports(count: int) -> list[int]:
    socks = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            socks.append(sock)
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def _placeholder_device(path: Path) -> None:
    """A character device with /dev/null's numbers: slurmd takes only device files as a GPU's File= (a plain file
    is rejected, and then no CUDA_VISIBLE_DEVICES is set), and nothing here opens it as a GPU."""
    if not path.exists():
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))


@dataclass
class SlurmCluster:
    root: Path
    gpus_per_node: int = 0  # >0: a fake Gres=gpu:N per node (placeholder device files)
    # True: every node is its own network namespace (tests/helpers/netns.py) with its own address, as separate
    # machines are; slurmctld listens on the bridge's address. False: every node on this host's loopback.
    network: bool = False
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    hosts: NetworkNamespaces | None = None

    @property
    def controller_address(self) -> str:
        return self.hosts.bridge_address if self.hosts else "127.0.0.1"

    def node_address(self, node: str) -> str:
        return self.hosts.addresses[NODES.index(node)] if self.hosts else "127.0.0.1"

    def node_pids(self, node: str) -> list[int]:
        """The processes running inside a namespaced node (slurmd and whatever its jobs started there)."""
        return self.hosts.pids(NODES.index(node)) if self.hosts else []

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def node_local(self) -> Path:
        """A folder that the last node sees as a different folder (node_local_copy), through a bind mount in its
        slurmd's own mount namespace: files that differ between nodes, as on machines with their own disks."""
        return self.root / "node-local"

    @property
    def node_local_copy(self) -> Path:
        return self.root / "node-local-copy"

    @property
    def env(self) -> dict[str, str]:
        """The environment for client commands (sbatch, sinfo, ...) and the jobs they submit."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    # -- set-up ----------------------------------------------------------------------------------------------
    def _write_config(self) -> None:
        host = socket.gethostname()
        ctld_port, *node_ports = _free_ports(1 + len(NODES))
        for sub in ("state", "spool", "log", "munge"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        (self.root / "munge").chmod(0o700)
        gres = ""
        if self.gpus_per_node:
            gres = f" Gres=gpu:{self.gpus_per_node}"
            lines = []
            for node in NODES:
                devices = self.root / "dev" / node
                devices.mkdir(parents=True, exist_ok=True)
                for index in range(self.gpus_per_node):
                    _placeholder_device(devices / f"nvidia{index}")
                lines.append(f"NodeName={node} Name=gpu File={devices}/nvidia[0-{self.gpus_per_node - 1}]")
            (self.root / "gres.conf").write_text("\n".join(lines) + "\n")
        nodes = "\n".join(
            f"NodeName={node} NodeHostname={host} NodeAddr={self.node_address(node)} Port={port} CPUs={CPUS_PER_NODE} "
            f"RealMemory={MEMORY_MIB_PER_NODE}{gres} State=UNKNOWN"
            for node, port in zip(NODES, node_ports, strict=True))
        r = self.root
        self.conf.write_text(f"""\
ClusterName=accelkit-test
SlurmctldHost={host}({self.controller_address})
SlurmctldPort={ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={r}/munge/munge.socket
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool/%n
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd.%n.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd.%n.log
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
TaskPluginParam=Cores
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU={DEF_MEM_PER_CPU_MIB}
{"GresTypes=gpu" if self.gpus_per_node else ""}
ReturnToService=2
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=300
{nodes}
PartitionName=debug Nodes={",".join(NODES)} Default=YES MaxTime=INFINITE State=UP
""")

    def _start(self, name: str, argv: list[str]) -> None:
        log = open(self.root / "log" / f"{name}.out", "wb")  # noqa: SIM115 - the daemon owns it until stop()
        self.procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            env=self.env, start_new_session=True)
        log.close()

    def start(self, timeout: float = 60.0) -> SlurmCluster:
        missing = missing_binaries()
        if missing:
            raise RuntimeError(f"{INSTALL_HINT}; missing: {', '.join(missing)}")
        self.root.mkdir(parents=True, exist_ok=True)
        if self.network and self.hosts is None:
            self.hosts = NetworkNamespaces(len(NODES)).start()
        self._write_config()
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        m = self.root / "munge"
        self._start("munged", [_binary("munged"), "--foreground", "--force", f"--socket={m}/munge.socket",
                               f"--key-file={key}", f"--pid-file={m}/munged.pid", f"--log-file={m}/munged.log",
                               f"--seed-file={m}/munged.seed", "--num-threads=2"])
        self._wait_for(lambda: (m / "munge.socket").exists(), "munged's socket", 20)
        self._start("slurmctld", [_binary("slurmctld"), "-D", "-i", "-f", str(self.conf)])
        self._wait_for(lambda: self._run(["scontrol", "ping"]).returncode == 0 and
                       "UP" in self._run(["scontrol", "ping"]).stdout, "slurmctld", timeout)
        for node in NODES:
            slurmd = [_binary("slurmd"), "-D", "-N", node, "-f", str(self.conf)]
            if node == NODES[-1]:  # this node sees its own copy of node_local (unshare execs: same PID)
                self.node_local.mkdir(exist_ok=True)
                self.node_local_copy.mkdir(exist_ok=True)
                slurmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                          'mount --bind "$0" "$1" && shift && exec "$@"', str(self.node_local_copy),
                          str(self.node_local), *slurmd]
            if self.hosts:  # nsenter changes the network only: slurmd needs the machine's /sys (its cgroups)
                slurmd = self.hosts.enter(NODES.index(node), *slurmd)
            self._start(f"slurmd-{node}", slurmd)
        self._wait_for(self.all_idle, "both nodes idle in sinfo", timeout)
        return self

    def _run(self, argv: list[str], timeout: float = 30) -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=timeout)

    def _wait_for(self, ready, what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            dead = [name for name, proc in self.procs.items() if proc.poll() is not None]
            if dead or time.monotonic() > deadline:
                logs = self.logs()
                self.stop()
                why = f"{', '.join(dead)} exited" if dead else f"not ready after {timeout:g} s"
                raise RuntimeError(f"the test Slurm cluster did not come up ({what}: {why})\n{logs}")
            time.sleep(0.3)

    def all_idle(self) -> bool:
        out = self._run(["sinfo", "-h", "-N", "-o", "%N %t"]).stdout.split()
        states = dict(zip(out[::2], out[1::2], strict=False))
        return all(states.get(node) == "idle" for node in NODES)

    def logs(self) -> str:
        parts = []
        for path in sorted((self.root / "log").glob("*")) + [self.root / "munge" / "munged.log"]:
            with contextlib.suppress(OSError):
                parts.append(f"--- {path.name}\n" + path.read_text(errors="replace")[-3000:])
        return "\n".join(parts)

    # -- use -------------------------------------------------------------------------------------------------
    def run(self, *argv: str, timeout: float = 60, cwd: Path | None = None,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """A Slurm client command against this cluster (`env`: more variables, which sbatch passes to the job)."""
        return subprocess.run(list(argv), env={**self.env, **(env or {})}, capture_output=True, text=True,
                              timeout=timeout, cwd=cwd)

    def sbatch_wait(self, script: Path, *extra: str, timeout: float = 240,
                    cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        """`sbatch --wait SCRIPT`: returns when the job ended, with the job's exit code. (sbatch polls the job's
        state with growing intervals, so it returns seconds after the job ended: `submit_and_wait` is quicker.)"""
        return self.run("sbatch", "--wait", *extra, str(script), timeout=timeout, cwd=cwd or script.parent)

    def submit(self, script: Path, env: dict[str, str] | None = None) -> str:
        """`sbatch SCRIPT` (with `env` added to the job's environment, from SCRIPT's folder): the job id."""
        submitted = self.run("sbatch", "--parsable", str(script), cwd=script.parent, env=env)
        job_id = submitted.stdout.strip().split(";")[0]
        if not job_id.isdigit():
            raise AssertionError(f"sbatch refused {script}: {submitted.stderr}")
        return job_id

    def job_fields(self, job_id: str) -> dict[str, str]:
        """`scontrol show job` as a dict (JobState, ExitCode, StartTime, EndTime, ...)."""
        shown = self.run("scontrol", "show", "job", "-o", job_id).stdout
        return dict(item.partition("=")[::2] for item in shown.split())

    def wait_job(self, job_id: str, timeout: float = 240) -> int:
        """Poll the job's state every 0.2 s until it ends: its exit code as sbatch --wait gives it."""
        deadline = time.monotonic() + timeout
        while True:
            fields = self.job_fields(job_id)
            state = fields.get("JobState", "")
            if state and state not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "SUSPENDED"):
                code, _, sig = fields.get("ExitCode", "0:0").partition(":")
                return int(code) or (128 + int(sig) if sig and int(sig) else 0)
            if time.monotonic() > deadline:
                self.run("scancel", job_id)
                raise AssertionError(f"job {job_id} still {state} after {timeout:g} s")
            time.sleep(0.2)

    def submit_and_wait(self, script: Path, timeout: float = 240,
                        env: dict[str, str] | None = None) -> tuple[str, int]:
        """Submit SCRIPT and wait for its end, polled (quicker than sbatch --wait): (job id, the job's exit code)."""
        job_id = self.submit(script, env=env)
        return job_id, self.wait_job(job_id, timeout)

    def wait_idle(self, timeout: float = 60) -> None:
        """Until both nodes are idle again (the previous job's epilog and clean-up are done)."""
        deadline = time.monotonic() + timeout
        while not self.all_idle():
            if time.monotonic() > deadline:
                raise AssertionError("the test Slurm cluster's nodes did not return to idle\n"
                                     + self.run("sinfo", "-N").stdout)
            time.sleep(0.3)

    # -- tear-down -------------------------------------------------------------------------------------------
    def cancel_all(self, timeout: float = 60) -> None:
        """Cancel every job of this cluster and wait until they are gone (their processes with them)."""
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            self.run("scancel", "--user", str(os.getuid()))
            deadline = time.monotonic() + timeout
            while self.run("squeue", "-h").stdout.strip() and time.monotonic() < deadline:
                time.sleep(0.5)

    def stop(self) -> None:
        """Stop exactly the daemons this object started (slurmd first, munged last), by PID."""
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            self.cancel_all()
        order = [name for name in self.procs if name.startswith("slurmd")] + ["slurmctld", "munged"]
        for name in order:
            proc = self.procs.get(name)
            if proc is None or proc.poll() is not None:
                continue
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs.clear()
        self._kill_job_leftovers()
        if self.hosts is not None:
            self.hosts.stop()
            self.hosts = None

    def _kill_job_leftovers(self) -> None:
        """Job processes that outlived the cluster (slurmstepd and what it started, had cancelling failed): their
        environment names this cluster's config, so they are ours and no one else's."""
        import psutil

        for proc in psutil.process_iter():
            with contextlib.suppress(psutil.Error):
                if proc.environ().get("SLURM_CONF") == str(self.conf):
                    proc.kill()

    def __enter__(self) -> SlurmCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


if __name__ == "__main__":
    counts = [int(arg) for arg in sys.argv[2:] if arg.isdigit()]
    cluster = SlurmCluster(Path(sys.argv[1]).resolve(), gpus_per_node=counts[0] if counts else 0,
                           network="--network" in sys.argv)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM stops the daemons too
    with cluster:
        print(f"export SLURM_CONF={cluster.conf}", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()


def module_cluster(root: Path, **settings) -> Iterator[SlurmCluster]:
    """The body of a test module's `cluster` fixture: a started cluster (a test failure naming the packages to
    install when Slurm is missing), stopped when the module's tests are done."""
    import pytest

    missing = missing_binaries()
    if missing:
        pytest.fail(f"{INSTALL_HINT}; missing: {', '.join(missing)}", pytrace=False)
    slurm = SlurmCluster(root, **settings)
    slurm.start()
    try:
        yield slurm
    finally:
        slurm.stop()


def write_job(project: Path, *args: str) -> Path:
    """`accelkit launch --slurm job.sbatch ARGS` in `project`: the job file it wrote."""
    from helpers import run_accelkit

    proc = run_accelkit("launch", "--slurm", "job.sbatch", *args, cwd=project)
    assert proc.returncode == 0, proc.stderr
    return project / "job.sbatch"
