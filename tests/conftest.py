"""Shared test set-up: every subprocess runs offline, single-threaded per rank, with the CLI of this checkout.

Layout: tests/unit/<package>/ (fast, in-process or short subprocesses), tests/integration/ (real multi-process
launches and training runs), tests/faults/ (bad inputs, signals and crashes). `slow` marks the real multi-process
and training runs: everything under tests/integration/, every test using the `merge_ckpts` checkpoints, and tests
marked by hand. Fast loop: `pytest -m "not slow"`.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers import DATA, OP_CACHE

# Ranks share two cores in CI: one intra-op thread each keeps distributed tests from oversubscribing.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ.pop("ACCELKIT_DEBUG", None)
# DeepSpeed's op build, once per suite (helpers.OP_CACHE); a lock a killed build leaves there is removed by the next
# `accelkit launch` (accelkit.launch.build_locks), so one shared folder cannot hang later tests.
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(OP_CACHE))

INTEGRATION = Path(__file__).resolve().parent / "integration"


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """The fast loop (`-m "not slow"`) would deselect every test of tests/integration/: it does not import them
    either, which spares each worker the imports those modules make when collected (transformers' tiny models,
    torch: about 4 s of CPU per worker on the build machine)."""
    if " ".join(config.option.markexpr.split()) == "not slow" and (
            collection_path == INTEGRATION or INTEGRATION in collection_path.parents):
        return True
    return None


# Seconds each of the longest test files takes on one worker of a quiet 2-core machine (2026-11-29). The two workers
# take whole files (--dist loadfile) in collection order: the longest first, so no long file starts last while the
# other worker has nothing left (a ZeRO resume file started last kept one worker alone for 10 minutes).
LONGEST_FILES = {
    "integration/test_convert_check.py": 650, "integration/test_convert_real_world.py": 570,
    "integration/test_templates.py": 343, "integration/test_nd_rehearsal.py": 337,
    "integration/test_pipeline_rehearsal.py": 293, "integration/test_slurm.py": 286, "integration/test_bench.py": 280,
    "faults/test_launch_faults.py": 260, "faults/test_convert_faults.py": 231, "integration/test_plan_measured.py": 229,
    "integration/test_cluster_targets.py": 224, "integration/test_ray_target.py": 217,
    "integration/test_zero_resume_on_ranks.py": 110, "integration/test_async_checkpoint.py": 187,
    "faults/test_bench_faults.py": 185, "faults/test_merge_faults.py": 180, "integration/test_slurm_lost.py": 181,
    "integration/test_grad_compression.py": 154, "integration/test_resume_world.py": 150,
    "faults/test_plan_faults.py": 142, "integration/test_preemption.py": 138,
}
TESTS_ROOT = Path(__file__).resolve().parent


def _file_seconds(item: pytest.Item) -> int:
    try:
        return LONGEST_FILES.get(Path(str(item.fspath)).resolve().relative_to(TESTS_ROOT).as_posix(), 0)
    except ValueError:
        return 0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: -_file_seconds(item))  # stable: each file's tests keep their order
    for item in items:
        # Real multi-process work: the integration tests, and every test on checkpoints made by the real tools.
        in_integration = INTEGRATION in Path(str(item.fspath)).resolve().parents
        if in_integration or "merge_ckpts" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True)
def _environment_restored():
    """Each test leaves os.environ as it found it. In-process launcher code sets variables for the ranks it would
    start (accelkit.launch.restarts: ACCELKIT_ATTEMPT); a leak reached a later Slurm job submitted from the same
    worker, whose ranks then said attempt 2 without any restart (two CI failures)."""
    saved = dict(os.environ)
    yield
    if os.environ != saved:
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture(scope="session")
def merge_ckpts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Checkpoints written once per session by the real tools (DeepSpeed ZeRO-1/2/3, FSDP2 + DCP, Accelerate's
    save_state under rehearsal, save_pretrained, torch.save): see tests/data/merge/producers.py."""
    import sys

    from filelock import FileLock

    sys.path.insert(0, str(DATA / "merge"))
    from producers import produce_all

    # Made once for the whole run, not once per xdist worker (about 100 s of CPU each): the workers' base folders
    # share a parent, and the first worker to get there makes them while the other waits on the lock.
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent
    with FileLock(str(shared / "merge-producers.lock")):
        return produce_all(shared / "merge-producers")


@pytest.fixture(scope="session")
def deepspeed_shm_op() -> Path:
    """DeepSpeed's shared-memory comm op built in the suite's cache (helpers.OP_CACHE), by DeepSpeed's own builder
    as a CPU rank would build it; a test that needs a built op in a folder of its own copies this one."""
    import subprocess
    import sys

    build = "from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder; ShareMemCommBuilder().load()"
    proc = subprocess.run([sys.executable, "-c", build], env={**os.environ, "TORCH_EXTENSIONS_DIR": str(OP_CACHE)},
                          capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return OP_CACHE / "deepspeed_shm_comm"
