"""The one N-D mesh type (issue 33, item 2): one dimension order, one parser of `dim=size,...`, and the same Mesh
from a resolved config, from bench's --layouts and inside plan's rows."""

from __future__ import annotations

import pytest

from accelkit.configs.mesh import ACCELERATE_DIMENSIONS, MESH_DIMENSIONS, Mesh
from accelkit.errors import AccelkitError


def test_one_order_pipeline_outermost() -> None:
    assert MESH_DIMENSIONS == ("pp", "dp_replicate", "dp_shard", "cp", "sp", "tp")
    assert MESH_DIMENSIONS[1:] == ACCELERATE_DIMENSIONS
    mesh = Mesh.parse("tp=2, PP_size=2,dp-shard=2")
    assert mesh == Mesh(pp=2, dp_shard=2, tp=2) and mesh.world == 8
    assert list(mesh.sizes) == list(MESH_DIMENSIONS)
    assert mesh.name == "dp_shard=2,tp=2,pp=2" and mesh.slug == "pp2-dp_shard2-tp2"
    assert mesh.option_values() == {"pp_size": 2, "dp_shard_size": 2, "tp_size": 2}
    # ranks row-major over the order: tp neighbours, dp_shard 2 apart, pp 4 apart
    assert [mesh.dimension_of(2, stride) for stride in (1, 2, 4)] == ["tp", "dp_shard", "pp"]
    assert mesh.dimension_of(4, 2) == "pp_dp_shard" and Mesh().name == "dp_replicate=1"


@pytest.mark.parametrize(("text", "match"), [
    ("ep=2", r"--layout: unknown dimension 'ep' in 'ep=2'"),
    ("pp=0", r"--layout: 'pp=0': a size is a whole number of 1 or more"),
    ("pp=2,pp=2", r"--layout: pp is given twice"),
    ("pp2", r"--layout: 'pp2' is not DIM=SIZE"),
])
def test_refusals_name_the_option(text: str, match: str) -> None:
    with pytest.raises(AccelkitError, match=match) as error:
        Mesh.parse(text, "--layout")
    assert error.value.hint and "\n" not in error.value.message


def test_config_bench_and_plan_hold_the_same_mesh() -> None:
    from accelkit.bench.layouts import parse_layouts
    from accelkit.configs import ConfigOptions
    from accelkit.configs.resolve import resolve_config
    from accelkit.plan.layout_option import parse_layout_option

    config = resolve_config(ConfigOptions(backend="fsdp", num_processes=4, pp_size=2), launch=True)
    (benched,) = parse_layouts("dp_shard=2,pp=2")
    planned = parse_layout_option("dp_shard=2,pp=2", None, None)
    assert config.parallelism.mesh == benched == planned.mesh == Mesh(pp=2, dp_shard=2)
    assert planned.name == benched.name == "dp_shard=2,pp=2" and planned.pipeline.ranks == 2
