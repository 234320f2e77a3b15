"""Property tests: any option combination gives a config Accelerate loads and launches, or a clear AccelkitError."""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from helpers.config import accelerate_roundtrip, findings, launcher_env
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accelkit.cli import cli
from accelkit.configs import ConfigOptions, machine_defaults, resolve_config, write_config
from accelkit.configs.choices import Backend, MixedPrecision, OffloadDevice, Sharding, StateDict, WrapPolicy
from accelkit.errors import AccelkitError

maybe = st.none().__or__
options_strategy = st.builds(
    ConfigOptions,
    backend=maybe(st.sampled_from(Backend.values())),
    preset=maybe(st.sampled_from(["ddp", "fsdp", "deepspeed_zero3_offload", "two_node_fsdp", "cpu", "nope"])),
    num_processes=maybe(st.integers(-1, 17)),
    num_machines=maybe(st.integers(0, 4)),
    machine_rank=maybe(st.integers(-1, 4)),
    main_process_ip=maybe(st.sampled_from(["10.0.0.1", "node0"])),
    main_process_port=maybe(st.integers(0, 70000)),
    mixed_precision=maybe(st.sampled_from(MixedPrecision.values())),
    gradient_accumulation_steps=maybe(st.integers(0, 8)),
    fsdp_version=maybe(st.sampled_from([1, 2])),
    sharding=maybe(st.sampled_from(Sharding.values())),
    wrap_policy=maybe(st.sampled_from(WrapPolicy.values())),
    wrap_cls=st.lists(st.sampled_from(["LlamaDecoderLayer", "GPT2Block"]), max_size=2, unique=True).map(tuple),
    min_num_params=maybe(st.integers(0, 10**9)),
    state_dict=maybe(st.sampled_from(StateDict.values())),
    offload=maybe(st.booleans()),
    activation_checkpointing=maybe(st.booleans()),
    cpu_ram_efficient_loading=maybe(st.booleans()),
    zero_stage=maybe(st.integers(0, 3)),
    offload_optimizer=maybe(st.sampled_from(OffloadDevice.values())),
    offload_params=maybe(st.sampled_from(OffloadDevice.values())),
    nvme_path=maybe(st.just("/nvme")),
    zero3_save_16bit_model=maybe(st.booleans()),
    deepspeed_json=maybe(st.just(Path("ds.json"))),
)


@pytest.fixture(autouse=True)
def no_gpus(monkeypatch):
    """Defaults must not depend on the machine running the tests (the patch is the same for every example)."""
    monkeypatch.setattr(machine_defaults, "gpu_count", lambda: 0)


def in_folder(resolved, folder: Path):
    """The same config with its DeepSpeed JSON written inside `folder` (the strategies name a relative ds.json)."""
    return replace(resolved, deepspeed=replace(resolved.deepspeed, json_file=str(folder / "ds.json")))


SETTINGS = settings(deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@settings(SETTINGS, max_examples=200)
@given(options=options_strategy)
def test_any_options_give_a_loadable_config_or_an_accelkit_error(options):
    try:
        resolved = resolve_config(options)
    except AccelkitError as exc:
        assert exc.message and exc.hint  # a message and a fix, never a bare failure
        return
    config, content = resolved.to_accelerate_dict(), resolved.deepspeed and resolved.deepspeed.json_content
    assert not [f for f in findings(config, deepspeed_json=content) if f.severity == "error"]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "c.yaml"
        if content is not None:  # keep the JSON inside the temporary directory
            resolved = in_folder(resolved, Path(tmp))
            config = resolved.to_accelerate_dict()
        write_config(resolved, path, "accelkit config (property test)")
        accelerate_roundtrip(path, config)
        args, _ = launcher_env(path)
        assert args.num_processes == config["num_processes"]


@st.composite
def plausible_options(draw) -> ConfigOptions:
    """Options that belong to the drawn backend, so most examples are valid configs that must load and launch."""
    backend = draw(st.sampled_from(Backend.values()))
    machines = draw(st.integers(1, 3))
    opts = ConfigOptions(backend=backend, num_machines=machines, machine_rank=draw(st.integers(0, machines - 1)),
                         mixed_precision=draw(maybe(st.sampled_from(("no", "bf16")))),
                         main_process_ip="10.0.0.1" if machines > 1 else None)
    if backend != "single":
        opts.num_processes = machines * draw(st.integers(1, 8))
    else:
        opts.num_machines, opts.machine_rank, opts.main_process_ip = None, None, None
    if backend == "fsdp":
        opts.fsdp_version = draw(st.sampled_from([1, 2]))
        v1_only = ["no", "hybrid"] if opts.fsdp_version == 1 else []
        opts.sharding = draw(st.sampled_from(["full", "grad-op", *v1_only]))
        opts.wrap_policy = draw(st.sampled_from(WrapPolicy.values()))
        if opts.wrap_policy == "transformer":
            opts.wrap_cls = ("GPT2Block",)
        opts.state_dict = draw(st.sampled_from(StateDict.values()))
        opts.offload = draw(st.booleans())
        opts.cpu_ram_efficient_loading = draw(st.booleans())
    if backend == "deepspeed":
        opts.zero_stage = draw(st.integers(0, 3))
        opts.offload = draw(st.booleans()) if opts.zero_stage else None
        opts.gradient_accumulation_steps = draw(st.integers(1, 4))
        if draw(st.booleans()):
            opts.deepspeed_json = Path("ds.json")
    return opts


@settings(SETTINGS, max_examples=120)
@given(options=plausible_options())
def test_backend_consistent_options_always_give_a_launchable_config(options):
    resolved = resolve_config(options)  # never raises for these
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "c.yaml"
        if resolved.json_path() is not None:
            resolved = in_folder(resolved, Path(tmp))
        config = resolved.to_accelerate_dict()
        write_config(resolved, path, "accelkit config (property test)")
        accelerate_roundtrip(path, config)
        args, env = launcher_env(path)
        assert args.num_processes == config["num_processes"]
        if options.backend == "fsdp":
            assert env["FSDP_VERSION"] == str(options.fsdp_version)


argv_strategy = st.lists(st.sampled_from([
    "--backend", "ddp", "fsdp", "deepspeed", "cpu", "single", "--num-processes", "0", "2", "3", "-1", "x",
    "--num-machines", "--machine-rank", "--zero-stage", "--offload", "--no-offload", "--sharding", "hybrid", "no",
    "--fsdp-version", "1", "--wrap-cls", "Block", "--wrap-policy", "size", "--mixed-precision", "fp16", "bf16",
    "--preset", "fsdp", "--list", "--offload-params", "nvme", "--nvme-path", "/n", "--gradient-accumulation-steps",
]), max_size=8)


@settings(SETTINGS, max_examples=150)
@given(argv=argv_strategy)
def test_cli_never_shows_a_traceback(argv):
    result = CliRunner().invoke(cli, ["config", *argv])
    # 0 = config printed, 1 = AccelkitError, 2 = click usage error: never an unexpected exception.
    assert result.exit_code in (0, 1, 2), result.output
    assert result.exception is None or isinstance(result.exception, (SystemExit, click.ClickException)), \
        repr(result.exception)
    assert "Traceback" not in result.output


values = st.one_of(st.none(), st.booleans(), st.integers(-3, 20), st.sampled_from(
    ["FSDP", "DEEPSPEED", "MULTI_GPU", "NO", "fp16", "bf16", "FULL_SHARD", "SHARD_GRAD_OP", "true", "x", "cpu", "nvme",
     "TRANSFORMER_BASED_WRAP", "ds.json"]), st.lists(st.integers(), max_size=2))
nested = st.dictionaries(st.sampled_from(
    ["fsdp_version", "fsdp_reshard_after_forward", "fsdp_sharding_strategy", "fsdp_auto_wrap_policy",
     "fsdp_cpu_ram_efficient_loading", "fsdp_sync_module_states", "zero_stage", "offload_param_device",
     "offload_optimizer_device", "deepspeed_config_file", "version", "zero_stag"]), values, max_size=5)
raw_configs = st.dictionaries(st.sampled_from(
    ["distributed_type", "num_processes", "num_machines", "machine_rank", "mixed_precision", "use_cpu",
     "main_process_ip", "rdzv_backend", "num_proceses", "mpirun_config"]), values, max_size=7).flatmap(
    lambda top: st.fixed_dictionaries({}, optional={"fsdp_config": st.one_of(nested, values),
                                                     "deepspeed_config": st.one_of(nested, values)}).map(
        lambda sections: {**top, **sections}))


@settings(SETTINGS, max_examples=100)
@given(config=raw_configs)
def test_check_never_crashes_on_any_yaml(config):
    import yaml

    from accelkit.configs import load_accelerate_config
    from accelkit.configs.files import check_config

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "c.yaml"
        path.write_text(yaml.safe_dump(config))
        findings = check_config(path)
        assert all(f.severity in ("error", "warning") and f.message and f.fix for f in findings)
        try:
            base = load_accelerate_config(path)
        except AccelkitError:
            return
        # whatever loads cleanly can be used as a base for new options, or is refused with a clear error
        try:
            resolve_config(ConfigOptions(), base=base)
        except AccelkitError as exc:
            assert exc.hint
