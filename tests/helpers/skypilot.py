"""SkyPilot's own task parser, run in SkyPilot's virtualenv (.ci/install-skypilot makes it: skypilot pins click<8.2,
which accelkit's tests cannot share). `parse_tasks(paths, secrets)` parses each file as `sky launch --secret ...`
does (`sky.Task.from_yaml_config` with the secrets' values) in one subprocess (importing sky takes seconds) and
returns, per file, what SkyPilot understood or the error it raised.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

INSTALL_HINT = "SkyPilot's virtualenv is missing: run `bash .ci/install-skypilot` (or set ACCELKIT_SKYPILOT_VENV)"

_PARSE = r"""
import json, sys
import sky

import yaml

secrets = json.loads(sys.argv[1])  # what `sky launch --secret NAME=VALUE` passes (sky's CLI: from_yaml_config)
out = []
for path in sys.argv[2:]:
    try:
        with open(path) as handle:
            config = yaml.safe_load(handle)
        task = sky.Task.from_yaml_config(config, secrets_overrides=list(secrets.items()) or None)
    except Exception as exc:
        out.append({"error": f"{type(exc).__name__}: {exc}"})
        continue
    accelerators = [r.accelerators for r in task.resources]
    out.append({"name": task.name, "num_nodes": task.num_nodes, "accelerators": accelerators,
                "cpus": [r.cpus for r in task.resources], "setup": task.setup, "run": task.run,
                "envs": task.envs, "workdir": task.workdir, "file_mounts": task.file_mounts,
                "memory": [r.memory for r in task.resources],
                "secrets": {name: value.get_secret_value() for name, value in task.secrets.items()},
                "unresolved_secrets": sorted(ref.name for ref in task.managed_secret_refs),
                "storage_mounts": {path: {"source": storage.source, "mode": storage.mode.value}
                                   for path, storage in (task.storage_mounts or {}).items()}})
print("SKY-RESULT " + json.dumps(out))
"""


def skypilot_python() -> Path:
    venv = Path(os.environ.get("ACCELKIT_SKYPILOT_VENV", Path.home() / ".cache" / "accelkit-skypilot-venv"))
    return venv / "bin" / "python"


def parse_tasks(paths: list[Path], secrets: dict[str, str] | None = None) -> list[dict]:
    """`secrets`: given as `sky launch --secret NAME=VALUE` gives them (None: none, as `sky launch task.yaml`)."""
    python = skypilot_python()
    if not python.exists():
        raise AssertionError(f"{INSTALL_HINT} ({python} not found)")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    with tempfile.TemporaryDirectory(prefix="sky-home-") as home:  # SkyPilot keeps its state in ~/.sky
        proc = subprocess.run([str(python), "-c", _PARSE, json.dumps(secrets or {}), *map(str, paths)],
                              capture_output=True, text=True, timeout=300, env={**env, "HOME": home})
    lines = [line for line in proc.stdout.splitlines() if line.startswith("SKY-RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout + proc.stderr
    return json.loads(lines[-1][len("SKY-RESULT "):])
