"""Run several scripts one after the other in this one process (saves an interpreter + torch start per script).

    python runner.py OUT.json script1.py script2.py ...

Each script runs as `__main__` with `sys.argv = [script]`, after `torch.manual_seed(0)` (so scripts that do not seed
themselves, like custom_init.py, start from the same weights in both runs); its exit status and stdout lines go to
OUT.json."""

import contextlib
import io
import json
import runpy
import sys
import traceback

import torch

out_path, scripts = sys.argv[1], sys.argv[2:]
results = {}
for script in scripts:
    torch.manual_seed(0)
    sys.argv = [script]
    buffer = io.StringIO()
    status = 0
    with contextlib.redirect_stdout(buffer):
        try:
            runpy.run_path(script, run_name="__main__")
        except SystemExit as exc:
            status = exc.code if isinstance(exc.code, int) else 1
        except Exception:
            traceback.print_exc(file=sys.stderr)
            status = 1
    results[script] = {"status": status, "lines": buffer.getvalue().splitlines()}
with open(out_path, "w") as handle:
    json.dump(results, handle)
