"""N-D parallelism in the one option table and the one rule set (issue 22, item 1): sizes on `config`/`launch`,
filled like Accelerate users write them, refused with Accelerate's reason, read back by Accelerate's own loader and
launcher, and the FSDP2 x TP version gap found in the installed packages' files."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from helpers.config import accelerate_roundtrip, findings, launcher_env

from accelkit import package_files
from accelkit.configs import ConfigOptions, compat, machine_defaults, write_config
from accelkit.configs.choices import CP_BACKENDS, SP_BACKENDS
from accelkit.configs.resolve import resolve_config
from accelkit.errors import AccelkitError


@pytest.fixture(autouse=True)
def no_gpus(monkeypatch):
    monkeypatch.setattr(machine_defaults, "gpu_count", lambda: 0)


@pytest.fixture
def versions_work(monkeypatch):
    """The layout rules alone: pretend the installed packages can run every layout."""
    monkeypatch.setattr(compat, "gaps", lambda **_: iter(()))


def resolve(**given):
    return resolve_config(ConfigOptions(**given), launch=True)


def refused(**given) -> str:
    with pytest.raises(AccelkitError) as info:
        resolve(**given)
    return str(info.value)


@pytest.mark.parametrize(("given", "sizes"), [
    ({"backend": "fsdp", "num_processes": 8, "tp_size": 2}, (1, 4, 2, 1, 1)),
    ({"backend": "fsdp", "num_processes": 4, "dp_replicate_size": 2}, (2, 2, 1, 1, 1)),
    ({"backend": "fsdp", "num_processes": 8, "dp_replicate_size": 2, "tp_size": 2}, (2, 2, 2, 1, 1)),
    ({"backend": "fsdp", "num_processes": 4, "cp_size": 2}, (1, 2, 1, 2, 1)),
    ({"backend": "ddp", "num_processes": 2, "tp_size": 2}, (1, 1, 2, 1, 1)),
    ({"backend": "deepspeed", "num_processes": 4, "sp_size": 2}, (1, 1, 1, 1, 2)),
])
def test_the_data_parallel_dimension_takes_what_the_others_leave(given, sizes, versions_work):
    p = resolve(**given).parallelism
    assert (p.dp_replicate, p.dp_shard, p.tp, p.cp, p.sp) == sizes


def test_no_size_given_means_no_parallelism_config():
    cfg = resolve(backend="fsdp", num_processes=4)
    assert cfg.parallelism is None and "parallelism_config" not in cfg.to_accelerate_dict()


@pytest.mark.parametrize(("given", "words"), [
    ({"backend": "ddp", "num_processes": 4, "tp_size": 2}, "Accelerate does not compose DDP with tensor parallelism"),
    ({"backend": "ddp", "num_processes": 4, "dp_shard_size": 4}, "DDP replicates, it does not shard"),
    ({"backend": "ddp", "num_processes": 2, "cp_size": 2}, "context parallelism needs FSDP2"),
    ({"backend": "fsdp", "num_processes": 4, "sp_size": 2}, "sequence parallelism is DeepSpeed's"),
    ({"backend": "deepspeed", "num_processes": 4, "tp_size": 2}, "Accelerate composes only sequence parallelism"),
    ({"backend": "fsdp", "num_processes": 2, "tp_size": 2}, "leaves FSDP nothing to shard"),
    ({"backend": "fsdp", "num_processes": 4, "dp_replicate_size": 2, "dp_shard_size": 1, "tp_size": 2},
     "not with pure replication"),
    ({"backend": "fsdp", "fsdp_version": 1, "num_processes": 4, "tp_size": 2}, "needs FSDP2"),
    ({"backend": "cpu", "num_processes": 2, "tp_size": 2}, "Accelerate refuses a ParallelismConfig on plain CPU"),
    ({"backend": "fsdp", "num_processes": 4, "cp_size": 2, "sp_size": 2}, "cannot be combined"),
    ({"backend": "fsdp", "num_processes": 8, "dp_shard_size": 2, "tp_size": 2}, "do not multiply to --num-processes 8"),
    ({"backend": "fsdp", "num_processes": 4, "tp_size": 0}, "--tp-size 0: a parallelism size is at least 1"),
    ({"backend": "deepspeed", "num_processes": 4, "sp_size": 3}, "--sp-size 3 does not divide --num-processes 4"),
    ({"backend": "fsdp", "num_processes": 16, "num_machines": 2, "main_process_ip": "10.0.0.1", "tp_size": 16},
     "tensor-parallel groups of 16 processes would span machines"),
    ({"backend": "fsdp", "num_processes": 24, "num_machines": 2, "main_process_ip": "10.0.0.1", "tp_size": 8},
     "tensor-parallel groups of 8 processes would span machines"),
])
def test_unsupported_layouts_are_refused_with_the_reason(given, words, versions_work):
    assert words in refused(**given)


def test_tp_within_machines_and_hsdp_across_them_is_accepted(versions_work):
    cfg = resolve(backend="fsdp", num_processes=32, num_machines=4, main_process_ip="10.0.0.1",
                  dp_replicate_size=4, tp_size=4)
    assert cfg.parallelism.active == {"dp_replicate": 4, "dp_shard": 2, "tp": 4}


def test_hsdp_on_one_machine_is_no_longer_refused_as_hybrid(versions_work):
    cfg = resolve(backend="fsdp", num_processes=4, dp_replicate_size=2, dp_shard_size=2, sharding="hybrid")
    assert cfg.to_accelerate_dict()["parallelism_config"]["parallelism_config_dp_replicate_size"] == 2


def test_fsdp2_tp_gap_is_named_in_one_line_with_versions_that_work(monkeypatch, tmp_path):
    accelerate = tmp_path / "accelerator.py"
    accelerate.write_text("from transformers.integrations.tensor_parallel import ReplicateParallel\n")
    old, new = tmp_path / "old.py", tmp_path / "new.py"
    old.write_text("class ReplicateParallel(TensorParallelLayer):\n    pass\n")
    new.write_text("class ColwiseParallel:\n    pass\n")
    applies_plans = tmp_path / "distributed_tp.py"  # transformers >= 5.2x: what accelkit's workaround uses
    applies_plans.write_text("def apply_tensor_parallelism(model, tp_mesh, tp_plan):\n    pass\n")
    files = {"accelerate": accelerate, "transformers": new}
    def fake(package, *parts):
        return files.get(f"{package}:distributed" if parts[:1] == ("distributed",) else package)

    monkeypatch.setattr(package_files, "package_file", fake)
    monkeypatch.setattr(compat, "package_file", fake)
    gap = compat.fsdp2_tp_gap()
    assert gap is not None and "\n" not in gap.message
    assert gap.message.startswith("FSDP2 x TP cannot start with accelerate ")
    assert "ReplicateParallel" in gap.message and "transformers==5.0.0" in gap.hint
    assert not compat.fsdp2_tp_workaround_needed()
    files["transformers"] = old  # the class Accelerate imports: runs unpatched
    assert compat.fsdp2_tp_gap() is None and not compat.fsdp2_tp_workaround_needed()
    files["transformers"], files["transformers:distributed"] = new, applies_plans  # runs through the workaround
    assert compat.fsdp2_tp_gap() is None and compat.fsdp2_tp_workaround_needed()
    del files["transformers:distributed"]
    # A launch stops on it; `accelkit config` (a file, maybe for another machine) only warns.
    files["transformers"] = new
    assert "FSDP2 x TP cannot start" in refused(backend="fsdp", num_processes=4, tp_size=2)
    written = resolve_config(ConfigOptions(backend="fsdp", num_processes=4, tp_size=2))
    assert any("FSDP2 x TP" in f.message for f in written.findings)
    # Layouts without TP under FSDP2 are not affected.
    assert resolve(backend="fsdp", num_processes=4, dp_replicate_size=2).parallelism.dp_shard == 2


@pytest.mark.slow  # imports transformers' tensor-parallel module (seconds)
def test_installed_packages_fsdp2_tp_verdict_matches_the_installed_transformers():
    """The real check on this machine's packages agrees with importing the class and the workaround's function."""
    try:
        from transformers.integrations.tensor_parallel import ReplicateParallel  # noqa: F401
        importable = True
    except ImportError:
        importable = False
    try:
        from transformers.distributed.tensor_parallel import apply_tensor_parallelism  # noqa: F401
        applicable = True
    except ImportError:
        applicable = False
    assert compat.fsdp2_tp_workaround_needed() == (not importable and applicable)
    assert (compat.fsdp2_tp_gap() is None) == (importable or applicable)


@pytest.mark.parametrize("given", [
    {"backend": "fsdp", "num_processes": 4, "dp_replicate_size": 2, "dp_shard_size": 2},
    {"backend": "fsdp", "num_processes": 8, "dp_shard_size": 2, "tp_size": 2, "cp_size": 2},
    {"backend": "ddp", "num_processes": 2, "tp_size": 2},
    {"backend": "deepspeed", "num_processes": 4, "sp_size": 4},
])
def test_yaml_loads_in_accelerate_and_reaches_the_ranks(given, tmp_path, versions_work):
    cfg = resolve_config(ConfigOptions(**given))
    path = tmp_path / "nd.yaml"
    write_config(cfg, path, "accelkit config (test)")
    written = yaml.safe_load(path.read_text())
    accelerate_roundtrip(path, written)
    _, env = launcher_env(path)
    p = cfg.parallelism
    assert env["ACCELERATE_USE_PARALLELISM_CONFIG"] == "true"
    for name, size in (("DP_REPLICATE", p.dp_replicate), ("DP_SHARD", p.dp_shard), ("TP", p.tp), ("CP", p.cp),
                       ("SP", p.sp)):
        assert env[f"PARALLELISM_CONFIG_{name}_SIZE"] == str(size)
    assert [f for f in findings(written) if f.is_error] == []


def test_a_file_is_read_back_with_its_sizes_and_unmodeled_keys(versions_work):
    raw = {"distributed_type": "FSDP", "num_processes": 4, "fsdp_config": {"fsdp_version": 2},
           "parallelism_config": {"parallelism_config_dp_shard_size": 2, "parallelism_config_cp_size": 2,
                                  "parallelism_config_cp_comm_strategy": "alltoall"}}
    cfg = resolve_config(ConfigOptions(), base=raw, base_label="nd.yaml", launch=True)
    section = cfg.to_accelerate_dict()["parallelism_config"]
    assert section["parallelism_config_cp_size"] == 2 and section["parallelism_config_cp_comm_strategy"] == "alltoall"
    found = findings({**raw, "parallelism_config": {"parallelism_config_tp_sise": 2}})
    assert any(f.code == "unknown-nested-key" and "parallelism_config_tp_size" in f.hint for f in found)
    bad = findings({**raw, "parallelism_config": {"parallelism_config_dp_shard_size": 3}})
    assert any(f.code == "nd-product" for f in bad)


def test_legacy_hybrid_file_still_follows_the_machine_count():
    raw = {"distributed_type": "FSDP", "num_processes": 16, "num_machines": 2, "main_process_ip": "10.0.0.1",
           "fsdp_config": {"fsdp_version": 2, "fsdp_reshard_after_forward": True},
           "parallelism_config": {"parallelism_config_dp_replicate_size": 2, "parallelism_config_dp_shard_size": 8,
                                  "parallelism_config_tp_size": 1, "parallelism_config_cp_size": 1}}
    cfg = resolve_config(ConfigOptions(num_processes=32, num_machines=4), base=raw, base_label="h.yaml", launch=True)
    section = cfg.to_accelerate_dict()["parallelism_config"]
    assert (section["parallelism_config_dp_replicate_size"], section["parallelism_config_dp_shard_size"]) == (4, 8)


def test_backend_choices_are_the_installed_accelerates():
    from accelerate.commands.launch import launch_command_parser

    actions = {a.dest: a for a in launch_command_parser()._actions}
    assert tuple(actions["parallelism_config_cp_backend"].choices) == CP_BACKENDS
    assert tuple(actions["parallelism_config_sp_backend"].choices) == SP_BACKENDS


def test_env_names_the_gap_in_one_line(monkeypatch):
    from accelkit import envinfo

    gap = compat.Gap("FSDP2 x TP", "FSDP2 x TP cannot start with accelerate 9 + transformers 9", "works with x")
    monkeypatch.setattr(compat, "installed_layout_gaps", lambda: [gap])
    info = {"python": "3", "platform": "p", "versions": {}, "cuda_available": False, "cuda_version": None,
            "nccl_available": False, "nccl_version": None, "gloo_available": True, "gpu_count": 0, "gpus": [],
            "accelerate_default_config": {"exists": False, "path": ""}, "nd_layouts": envinfo._nd_layouts()}
    text = envinfo.format_text(info)
    assert "  FSDP2 x TP cannot start with accelerate 9 + transformers 9; works with x" in text.splitlines()


def test_path_helper_finds_files_without_importing(tmp_path):
    assert package_files.package_file("accelkit", "configs", "compat.py") == Path(compat.__file__)
    assert package_files.package_file("no_such_package_here") is None


def test_cpu_rehearsal_refuses_cp_and_runs_sp(versions_work):
    from dataclasses import replace

    from accelkit.configs.rules import check_rules

    cp = resolve(backend="fsdp", num_processes=4, cp_size=2)
    found = check_rules(replace(cp, use_cpu=True))
    assert any(f.code == "cp-on-cpu" and f.is_error for f in found)
    sp = resolve(backend="deepspeed", num_processes=2, sp_size=2)
    found = check_rules(replace(sp, use_cpu=True))
    assert [f.code for f in found if f.code.startswith("sp-")] == []
    assert not any(f.is_error for f in found)


def test_the_cp_refusal_is_true_of_the_installed_torch():
    """context_parallel's ring attention covers only SDPA kernels that have no CPU implementation, and the CPU's own
    SDPA kernel has no context-parallel rule: the reason cp-on-cpu gives."""
    import inspect

    import torch
    from torch.distributed.tensor.experimental import context_parallel

    q = torch.randn(1, 2, 8, 4)
    kernels = {"_scaled_dot_product_flash_attention": (q, q, q, 0.0, True),
               "_scaled_dot_product_efficient_attention": (q, q, q, None, True, 0.0, True),
               "_scaled_dot_product_cudnn_attention": (q, q, q, None, True, 0.0, True)}
    for name, args in kernels.items():
        with pytest.raises(NotImplementedError, match="CPU"):
            getattr(torch.ops.aten, name)(*args)
    source = Path(inspect.getsourcefile(inspect.unwrap(context_parallel))).read_text()  # under @contextmanager
    assert all(f"aten.{name}" in source for name in kernels)
    assert "_scaled_dot_product_flash_attention_for_cpu" not in source
