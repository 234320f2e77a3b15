"""SIGTERM/SIGHUP become Terminated (exit 128+N with cleanup), but never inside an import: a module interrupted
while it runs its top level stays half-initialised (numpy then fails with a RecursionError on the way out, and an
extension calling back into Python aborts the process)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PROGRAM = textwrap.dedent("""
    import signal, sys, time
    sys.path.insert(0, sys.argv[1])
    from accelkit.errors import Terminated, raise_on_termination
    raise_on_termination()
    try:
        import interrupted_module
        time.sleep(5)
        print("not stopped")
    except Terminated as stop:
        module = sys.modules.get("interrupted_module")
        print("stopped", stop.exit_code, "import finished:", getattr(module, "FINISHED", False))
""")

MODULE = textwrap.dedent("""
    import os, signal, time
    os.kill(os.getpid(), signal.{name})
    for _ in range(50):  # bytecode runs here: the handler is called inside this import
        time.sleep(0.001)
    FINISHED = True
""")


@pytest.mark.parametrize("name", ["SIGTERM", "SIGHUP"])
def test_a_signal_during_an_import_stops_the_command_after_the_import_finished(name: str, tmp_path: Path) -> None:
    (tmp_path / "interrupted_module.py").write_text(MODULE.format(name=name))
    result = subprocess.run([sys.executable, "-c", PROGRAM, str(tmp_path)], capture_output=True, text=True,
                            timeout=60)
    signum = getattr(signal, name)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"stopped {128 + signum} import finished: True"


def test_a_signal_outside_an_import_stops_at_once(tmp_path: Path) -> None:
    program = ("import os, signal, time\nfrom accelkit.errors import Terminated, raise_on_termination\n"
               "raise_on_termination()\nstart = time.monotonic()\n"
               "try:\n    os.kill(os.getpid(), signal.SIGTERM)\n    time.sleep(5)\n"
               "except Terminated as stop:\n    print(stop.exit_code, time.monotonic() - start < 1)\n")
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "143 True", result.stderr


def test_a_signal_deferred_out_of_an_import_stops_the_next_write_before_it_is_committed(tmp_path: Path) -> None:
    """The command ends its work before the deferred signal is sent again: the write it was about to commit is
    not committed, and the command stops with 128+N."""
    (tmp_path / "interrupted_module.py").write_text(MODULE.format(name="SIGTERM"))
    output = tmp_path / "out.txt"
    program = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(tmp_path)!r})
        from accelkit import errors, fsio
        errors.IMPORT_RETRY_SECONDS = 30  # the resend would come long after the write
        errors.raise_on_termination()
        try:
            import interrupted_module
            fsio.atomic_write({str(output)!r}, "written")
            print("not stopped")
        except errors.Terminated as stop:
            print("stopped", stop.exit_code)
    """)
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "stopped 143", result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["interrupted_module.py"]
