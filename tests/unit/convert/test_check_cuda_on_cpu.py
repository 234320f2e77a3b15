"""--check's second run of an original that stopped for want of a GPU (accelkit.convert.check.cuda_on_cpu): when it
is run again with its CUDA calls rehearsed on the CPU, and how the report says so."""

from __future__ import annotations

from accelkit.convert.check.cuda_on_cpu import failed_for_cuda, rehearsal_env
from accelkit.convert.check.invariants import PASS, Verdict
from accelkit.convert.check.run_check import REHEARSED_LINE, CheckOutcome

TRACE = "Traceback (most recent call last):\n  File \"train.py\", line {line}, in <module>\n    {code}\n{error}\n"


def test_a_failure_at_a_cuda_call_is_run_again_with_the_rehearsal() -> None:
    for code, error in [("model.cuda()", "AssertionError: Torch not compiled with CUDA enabled"),
                        ("model.to(gpu_id)", "RuntimeError: Cannot access accelerator device when none is available."),
                        ("torch.cuda.set_device(0)", "AttributeError: module 'torch._C' has no attribute 'x'"),
                        ("assert torch.cuda.is_available()", "AssertionError"),
                        ("init_process_group('nccl')", "RuntimeError: Distributed package doesn't have NCCL built in")]:
        assert failed_for_cuda(1, TRACE.format(line=3, code=code, error=error)), code
    assert failed_for_cuda(1, "this script needs a GPU\n")  # its own sys.exit message: no traceback


def test_other_failures_runs_that_passed_and_stopped_runs_are_not() -> None:
    missing = TRACE.format(line=9, code="open('data.csv')", error="FileNotFoundError: data.csv")
    # an earlier traceback that named CUDA does not count: only the one the run ended with
    earlier = TRACE.format(line=2, code="x.cuda()", error="AssertionError: Torch not compiled with CUDA enabled")
    assert not failed_for_cuda(1, missing)
    assert not failed_for_cuda(1, earlier + "handled\n" + missing)
    assert not failed_for_cuda(0, earlier)
    assert not failed_for_cuda(None, earlier)  # stopped for a hang: the no-hang verdict says so


def test_the_rehearsal_is_asked_of_the_bootstrap_by_the_rehearsal_variable() -> None:
    from accelkit.rehearsal import REHEARSAL_ENV

    assert rehearsal_env() == {REHEARSAL_ENV: "one-gpu"}


def test_the_report_says_in_one_line_that_the_original_ran_with_cuda_rehearsed() -> None:
    outcome = CheckOutcome("train.py", [Verdict("ran", PASS, "original on 1 process, CUDA rehearsed on CPU")],
                           cuda_rehearsed=True)
    lines = outcome.format().splitlines()
    assert lines[0] == f"  note  {REHEARSED_LINE}" and len(lines) == 2
    assert "note" not in CheckOutcome("train.py", outcome.verdicts).format()
