"""Launch-decided settings inherited from the shell are dropped, each with a line; the launch's own are kept."""

from __future__ import annotations

from accelkit.configs.pipeline_spec import ENV_VAR
from accelkit.launch.inherited import DECIDED_BY_THE_LAUNCH, PIPELINE_ENV, drop_inherited_settings


def test_the_pipeline_variable_is_the_one_configs_writes() -> None:
    assert PIPELINE_ENV == ENV_VAR


def test_inherited_settings_the_launch_does_not_set_are_dropped_with_a_line() -> None:
    environ = {"ACCELKIT_GRAD_COMPRESSION": "bogus", "ACCELKIT_PIPELINE": "pp=2", "ACCELKIT_REHEARSAL": "fsdp",
               "HF_HOME": "/data"}
    lines = drop_inherited_settings(environ, {"ACCELKIT_REHEARSAL": "ddp"})
    assert environ == {"ACCELKIT_REHEARSAL": "fsdp", "HF_HOME": "/data"}  # the plan's value replaces it later
    assert [line.split("=")[0] for line in lines] == ["accelkit: ignoring ACCELKIT_PIPELINE",
                                                      "accelkit: ignoring ACCELKIT_GRAD_COMPRESSION"]
    assert set(DECIDED_BY_THE_LAUNCH) == {"ACCELKIT_PIPELINE", "ACCELKIT_GRAD_COMPRESSION", "ACCELKIT_REHEARSAL"}
