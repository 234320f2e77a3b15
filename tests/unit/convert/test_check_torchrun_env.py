"""`convert --check` runs a torchrun-only original (it reads LOCAL_RANK with no fallback, or makes its process
group from the environment) under a 1-process torchrun environment; a script with its own single-process path
runs as it is."""

from __future__ import annotations

import textwrap

from accelkit.convert.check.torchrun_env import needs_launcher, one_process_env


def needs(source: str) -> bool:
    return needs_launcher(textwrap.dedent(source))


def test_a_script_that_reads_the_launchers_variables_with_no_fallback_needs_a_launcher() -> None:
    # the DDP tutorials' multigpu_torchrun.py: KeyError 'LOCAL_RANK' on a plain `python script.py`
    assert needs("""
        import os
        local_rank = int(os.environ["LOCAL_RANK"])
    """)
    assert needs("""
        from os import environ
        world = int(environ["WORLD_SIZE"])
    """)
    # the group made from the environment (env://): "environment variable RANK expected"
    assert needs("""
        import torch.distributed as dist
        dist.init_process_group("gloo")
    """)
    assert needs("""
        from torch.distributed import init_process_group
        init_process_group(backend="nccl")
    """)


def test_a_script_with_its_own_single_process_path_gets_no_launcher_environment() -> None:
    # nanoGPT / build-nanogpt: `ddp = int(os.environ.get('RANK', -1)) != -1`, DDP only then
    assert not needs("""
        import os
        from torch.distributed import init_process_group
        ddp = int(os.environ.get("RANK", -1)) != -1
        if ddp:
            init_process_group(backend="nccl")
            rank = int(os.environ["RANK"])
    """)
    assert not needs("""
        import os
        if "LOCAL_RANK" in os.environ:
            local_rank = int(os.environ["LOCAL_RANK"])
    """)
    assert not needs("""
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:29500", rank=0, world_size=1)
    """)
    assert not needs("import os\npath = os.environ['HOME']\n")  # not a launcher's variable
    assert not needs("def broken(:\n")  # the conversion reports the syntax error, not this


def test_the_environment_is_a_one_process_torchruns() -> None:
    env = one_process_env()
    assert {k: env[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")} == \
        {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1"}
    assert env["MASTER_ADDR"] == "127.0.0.1" and 0 < int(env["MASTER_PORT"]) < 65536
