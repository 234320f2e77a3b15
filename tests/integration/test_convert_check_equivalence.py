"""`convert --check` against the original (issue #41): the original on 1 process at the conversion's global batch,
weights compared after every optimizer step. Mutation tests: a correct conversion broken in one known way must FAIL
the invariant it breaks. Few real runs (2 checks, two at a time): the corpus checks live in test_convert_check.py."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from test_convert_check import CORPUS_DIR, Checked, _check, _converted, _replace

pytestmark = pytest.mark.timeout(1800)


def sum_loss_unscaled() -> str:
    """The conversion as it was before issue #41: the per-process sum averaged by DDP, half the original's step."""
    return _replace(_converted("sum_reduced_loss"), "accelerator.backward(loss * accelerator.num_processes)",
                    "accelerator.backward(loss)")


def loader_not_prepared() -> str:
    """The sharding removed: both ranks train on every sample."""
    return _replace(_converted("sum_reduced_loss"),
                    "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)",
                    "model, optimizer = accelerator.prepare(model, optimizer)")


MUTANTS = {
    # name: (make the broken conversion, invariant that must FAIL, words its line must hold)
    "sum_loss_unscaled": (sum_loss_unscaled, "weights", "after step 1 the weights differ from the original's"),
    "loader_not_prepared": (loader_not_prepared, "samples", "loader #0"),
}


@pytest.fixture(scope="module")
def mutants(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Checked]:
    jobs = {}
    for name, (make, _, _) in MUTANTS.items():
        work = tmp_path_factory.mktemp(f"mutant-{name}")
        converted = work / "sum_reduced_loss_mutant.py"
        converted.write_text(make())
        jobs[name] = (CORPUS_DIR / "sum_reduced_loss.py", work, converted)
    with ThreadPoolExecutor(2) as pool:
        futures = {key: pool.submit(_check, *job) for key, job in jobs.items()}
        return {key: future.result() for key, future in futures.items()}


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_check_fails_the_mutant_naming_the_invariant(name: str, mutants: dict[str, Checked]) -> None:
    checked = mutants[name]
    _, invariant, words = MUTANTS[name]
    verdicts = checked.verdicts()
    assert checked.returncode == 1, checked.text()
    assert verdicts[invariant][0] == "FAIL", checked.text()
    assert words in verdicts[invariant][1], checked.text()
    errors = [line for line in checked.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and invariant in errors[0] and "Traceback" not in checked.stderr


def test_the_unscaled_sum_names_the_parameter_and_the_tolerance(mutants: dict[str, Checked]) -> None:
    summary = mutants["sum_loss_unscaled"].verdicts()["weights"][1]
    assert "Linear." in summary and "(tolerance 0.0001)" in summary, summary
    assert "batch set by the check to 16 (8 per rank)" in mutants["sum_loss_unscaled"].stdout
