"""What the user asked `accelkit launch` for, as one value that can cross a process boundary (JSON).

The command line is parsed in the light `accelkit` process; the config is resolved in the launcher process, which
imports torch and Accelerate anyway (see worker.py), so the request travels between them as JSON.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from accelkit.configs import ConfigOptions
from accelkit.launch.launch_plan import LauncherFlags, LaunchTarget


@dataclass
class LaunchRequest:
    target: LaunchTarget
    options: ConfigOptions = field(default_factory=ConfigOptions)
    config_file: Path | None = None
    cpu: bool = False
    flags: LauncherFlags = field(default_factory=LauncherFlags)
    command_line: str = "accelkit launch"
    # Set for SLURM: the job's shape replaces any machine-specific value (rank, address) given locally.
    for_cluster: bool = False
    # Option field -> how the user actually gave it, when not by its own flag (e.g. "--nodes x --gpus-per-node").
    source_labels: dict[str, str] = field(default_factory=dict)
    # Modules whose install() each rank runs before the script (accelkit.ranks.bootstrap, $ACCELKIT_PROBES).
    probes: tuple[str, ...] = ()
    # Multi-machine jobs: seconds without a machine's heartbeat before machine 0 declares it lost (None: default).
    lost_timeout: float | None = None
    # Seconds the ranks get to save after a SIGTERM (accelkit.launch.preemption); None: the default; 0: none.
    preemption_grace: float | None = None
    # Every line a rank prints through Python starts with `[rank N] ` (accelkit.ranks.rank_output).
    rank_prefix: bool = False

    def preemption_grace_seconds(self) -> float | None:
        """The supervisor's setting: None when SIGTERM is to stop the job at once."""
        from accelkit.launch.preemption import DEFAULT_PREEMPTION_GRACE

        grace = DEFAULT_PREEMPTION_GRACE if self.preemption_grace is None else self.preemption_grace
        return grace or None

    def to_json(self) -> str:
        return json.dumps({
            "target": {**asdict(self.target), "args": list(self.target.args)},
            "options": self.options.to_json_dict(),
            "config_file": None if self.config_file is None else str(self.config_file),
            "cpu": self.cpu,
            "flags": asdict(self.flags),
            "command_line": self.command_line,
            "for_cluster": self.for_cluster,
            "source_labels": self.source_labels,
            "probes": list(self.probes),
            "lost_timeout": self.lost_timeout,
            "preemption_grace": self.preemption_grace,
            "rank_prefix": self.rank_prefix,
        })

    @classmethod
    def from_json(cls, text: str) -> LaunchRequest:
        data = json.loads(text)
        target = data["target"]
        return cls(
            target=LaunchTarget(script=target["script"], args=tuple(target["args"]), module=target["module"]),
            options=ConfigOptions.from_json_dict(data["options"]),
            config_file=None if data["config_file"] is None else Path(data["config_file"]),
            cpu=data["cpu"],
            flags=LauncherFlags(**data["flags"]),
            command_line=data["command_line"],
            for_cluster=data["for_cluster"],
            source_labels=data.get("source_labels", {}),
            probes=tuple(data.get("probes", ())),
            lost_timeout=data.get("lost_timeout"),
            preemption_grace=data.get("preemption_grace"),
            rank_prefix=data.get("rank_prefix", False),
        )
