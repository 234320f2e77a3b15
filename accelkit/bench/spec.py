"""What a benchmark runs, as typed values checked before anything starts: the sweep (world sizes x backends), the
measured steps, the scaling mode and how the script is told its batch size.

Weak scaling (the default for data parallelism): the per-device batch stays fixed, so the script runs with its
arguments unchanged at every world size. Strong scaling: the global batch G stays fixed, and each run tells the
script its per-device batch G / N through the flag named by `--batch-arg` (G is `--global-batch`, or the value
that flag has in the script's arguments).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from accelkit.bench.layouts import batch_replicas
from accelkit.configs import Mesh
from accelkit.errors import AccelkitError
from accelkit.script_flags import flag_value, set_flag

SCALING_MODES = ("weak", "strong")
BENCH_BACKENDS = ("single", "cpu", "ddp", "fsdp", "deepspeed")


@dataclass(frozen=True)
class CommSettings:
    sizes: tuple[int, ...]  # bytes
    iters: int
    warmup: int


@dataclass(frozen=True)
class RunSpec:
    """One point of the sweep: the script launched on `num_processes` processes with `backend`."""

    index: int  # 1-based position in the sweep
    total: int
    backend: str | None  # as asked (None: the config file's or the default backend)
    num_processes: int
    script_args: tuple[str, ...]
    per_device_batch: int | None = None  # set under strong scaling
    layout: Mesh | None = None  # --layouts: the N-D layout this run launches

    @property
    def name(self) -> str:
        if self.layout is not None:
            return f"{self.backend or 'default'}-{self.layout.slug}"
        return f"{self.backend or 'default'}-np{self.num_processes}"


@dataclass(frozen=True)
class BenchSpec:
    script: str | None  # None: --comm alone
    script_args: tuple[str, ...]
    module: bool
    world_sizes: tuple[int, ...]
    backends: tuple[str | None, ...]  # several with --compare-backends; (None,) = config/default backend
    steps: int
    warmup: int
    scaling: str = "weak"
    batch_arg: str | None = None
    global_batch: int | None = None
    cpu: bool = False
    comm: CommSettings | None = None
    output: Path = Path("bench-results")
    show_output: bool = False
    timeout: float | None = None  # seconds per run
    stall_timeout: float | None = None  # the supervisor's stall watchdog (None: its default; 0: off)
    machines: int = 1  # each machine runs the same sweep; results cover this machine's ranks
    min_time: float = 0.0  # seconds: every run measures at least this long (and at least `steps` steps)
    layouts: tuple[Mesh, ...] = ()  # --layouts: one run per layout at world_sizes[0] (backends[0] or its own)
    command_words: tuple[str, ...] = ("accelkit", "bench")  # the command as typed, up to SCRIPT (for hints)
    script_words: tuple[str, ...] = ()  # SCRIPT and its arguments as typed

    def runs(self) -> list[RunSpec]:
        if self.script is None:
            return []
        points: list[tuple[str | None, int, Mesh | None]]
        if self.layouts:
            points = [(self.backends[0] or layout.natural_backend, layout.world, layout) for layout in self.layouts]
        else:
            points = [(backend, n, None) for backend in self.backends for n in self.world_sizes]
        runs = []
        for index, (backend, n, layout) in enumerate(points, start=1):
            args, per_device = self.script_args, None
            if self.scaling == "strong":
                assert self.global_batch is not None and self.batch_arg is not None
                per_device = self.global_batch // data_parallel_degree(n, layout)
                args = set_flag(args, self.batch_arg, str(per_device))
            runs.append(RunSpec(index, len(points), backend, n, args, per_device, layout))
        return runs


def data_parallel_degree(num_processes: int, layout: Mesh | None) -> int:
    """Processes that take different batches: all of them, but one per tensor/context-parallel group."""
    return num_processes // batch_replicas(layout) if layout is not None else num_processes


# -- parsing and checks (all before anything starts) -------------------------------------------------------------
def parse_int_list(text: str, what: str) -> tuple[int, ...]:
    values = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or int(part) < 1:
            raise AccelkitError(f"{what} takes whole numbers of 1 or more separated by commas (got {text!r})",
                                hint=f"e.g. {what} 1,2,4,8")
        values.append(int(part))
    return tuple(dict.fromkeys(sorted(values)))


def parse_backends(text: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(name.strip() for name in text.split(",") if name.strip()))
    unknown = [name for name in names if name not in BENCH_BACKENDS]
    if unknown or not names:
        named = ", ".join(unknown) if unknown else repr(text)
        raise AccelkitError(f"--compare-backends: unknown backend {named}",
                            hint=f"choose from {', '.join(BENCH_BACKENDS)}, e.g. --compare-backends ddp,fsdp,deepspeed")
    return names


def resolve_global_batch(spec_args: tuple[str, ...], batch_arg: str | None, global_batch: int | None,
                         world_sizes: tuple[int, ...]) -> int:
    """The global batch of a strong-scaling sweep, checked against every world size (with --layouts: every
    layout's data-parallel degree)."""
    if batch_arg is None:
        raise AccelkitError("--scaling strong needs the script's batch-size flag, to tell each run its per-device "
                            "batch (global batch / processes)",
                            hint="pass --batch-arg FLAG, e.g. --batch-arg --per-device-batch-size")
    if global_batch is None:
        given = flag_value(spec_args, batch_arg)
        if given is None:
            raise AccelkitError(f"--scaling strong: no global batch (no --global-batch, and {batch_arg} is not "
                                "among the script's arguments)",
                                hint=f"pass --global-batch G, or give the script {batch_arg} G (read as the global "
                                     "batch)")
        if not given.isdigit() or int(given) < 1:
            raise AccelkitError(f"--scaling strong: {batch_arg} {given} is not a batch size",
                                hint=f"give the script {batch_arg} as a whole number, or pass --global-batch G")
        global_batch = int(given)
    uneven = [n for n in world_sizes if global_batch % n or global_batch < n]
    if uneven:
        raise AccelkitError(f"--scaling strong: the global batch {global_batch} does not split evenly over "
                            f"{', '.join(map(str, uneven))} process(es)",
                            hint="choose a global batch divisible by every world size, e.g. "
                                 f"--global-batch {_lcm(world_sizes) * max(1, global_batch // _lcm(world_sizes))}")
    return global_batch


def _lcm(values: tuple[int, ...]) -> int:
    import math

    out = 1
    for value in values:
        out = out * value // math.gcd(out, value)
    return out


def default_world_sizes(devices: int) -> tuple[int, ...]:
    """1 and every power of two up to `devices`, and `devices` itself (so 6 GPUs give 1, 2, 4, 6)."""
    sizes = [1]
    while sizes[-1] * 2 <= devices:
        sizes.append(sizes[-1] * 2)
    if devices > sizes[-1]:
        sizes.append(devices)
    return tuple(sizes)


def check_counts(steps: int, warmup: int, min_time: float = 0.0) -> None:
    from accelkit.limits import MAX_STEPS

    if steps < 1:
        raise AccelkitError(f"--steps must be at least 1 (got {steps})", hint="e.g. --steps 20")
    for option, value in (("--steps", steps), ("--warmup", warmup)):
        if value > MAX_STEPS:
            raise AccelkitError(f"{option} {value:,} is beyond any benchmark window (the limit is {MAX_STEPS:,} "
                                "steps)", hint=f"e.g. {option} {20 if option == '--steps' else 5}; --min-time makes "
                                     "the window longer in seconds")
    if not min_time >= 0 or min_time == float("inf"):
        raise AccelkitError(f"--min-time must be a finite number of seconds, 0 or more (got {min_time})",
                            hint="e.g. --min-time 2 (0: measure exactly --steps steps)")
    if warmup < 0:
        raise AccelkitError(f"--warmup cannot be negative (got {warmup})", hint="e.g. --warmup 5 (or 0 for none)")


def check_output(output: Path, force: bool) -> None:
    """Results go to a folder of their own; earlier results are kept unless --force."""
    from accelkit.fsio import writable_target

    if output.exists() and not output.is_dir():
        raise AccelkitError(f"-o {output}: a file is in the way (results are a folder)",
                            hint="pass -o with a folder name, e.g. -o bench-results")
    for name in RESULT_NAMES:  # what a run writes inside DIR: never through a FIFO, a device or the wrong kind
        writable_target(output / name, is_dir=name == "runs")
    if (output / "bench.json").exists() and not force:
        raise AccelkitError(f"-o {output} already holds results (bench.json)",
                            hint="pass another -o DIR, or --force to replace them")


RESULT_NAMES = ("bench.json", "bench.csv", "scaling.png", "runs")  # what --force replaces in DIR (nothing else)
