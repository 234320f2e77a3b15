"""Settings a launch decides from its own options, never from the shell it was started in.

The pipeline layout ($ACCELKIT_PIPELINE), the gradient compression ($ACCELKIT_GRAD_COMPRESSION) and the rehearsed
backend ($ACCELKIT_REHEARSAL) reach the ranks as environment variables that the launch sets from its config. One left
exported in the user's shell (from an earlier experiment, or a copied command line) would reach every rank of a
launch whose options say otherwise: a layout that is not the job's, or a bad value that fails on every rank. The
launcher drops them and says so; the launch then sets what its own options decide.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping

from accelkit.compression.compression_spec import ENV_VAR as COMPRESSION_ENV
from accelkit.rehearsal import REHEARSAL_ENV

# accelkit.configs.pipeline_spec.ENV_VAR (the configs package keeps it to itself; a unit test checks the spelling)
PIPELINE_ENV = "ACCELKIT_PIPELINE"
DECIDED_BY_THE_LAUNCH = (PIPELINE_ENV, COMPRESSION_ENV, REHEARSAL_ENV)


def drop_inherited_settings(environ: MutableMapping[str, str], decided: Mapping[str, str]) -> list[str]:
    """Remove from `environ` the launch-decided variables it inherited that the launch (`decided`: the plan's
    environment) does not set itself; one line per variable dropped."""
    lines = []
    for name in DECIDED_BY_THE_LAUNCH:
        if name in environ and name not in decided:
            value = environ.pop(name)
            lines.append(f"accelkit: ignoring {name}={value!r} from the environment: the launch's own options decide "
                         f"it (unset it in your shell to silence this)")
    return lines
