"""`--key=value` overrides of gpt_style.py's globals, with a type check (a configurator exec'd by the script)."""
import sys
from ast import literal_eval

for arg in sys.argv[1:]:
    if not arg.startswith("--") or "=" not in arg:
        continue
    key, val = arg[2:].split("=", 1)
    try:
        attempt = literal_eval(val)
    except (SyntaxError, ValueError):
        attempt = val
    assert type(attempt) == type(globals()[key]), f"{key}: {type(attempt)} is not {type(globals()[key])}"
    print(f"Overriding: {key} = {attempt}")  # on every process, as nanoGPT's configurator.py does
    globals()[key] = attempt
