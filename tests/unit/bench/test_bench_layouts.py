"""--layouts parsing (the one mesh parser, accelkit.configs.mesh): the syntax, the spellings read as a dimension, and
every refusal, in one line with a hint; bench's own rules over a mesh (its backend, the ranks that share a batch)."""

from __future__ import annotations

import pytest

from accelkit.bench.layouts import batch_replicas, parse_layouts
from accelkit.configs.mesh import Mesh
from accelkit.errors import AccelkitError


def test_syntax_and_spellings() -> None:
    assert parse_layouts(("dp_shard=4;dp_shard=2,tp=2",)) == (Mesh(dp_shard=4), Mesh(dp_shard=2, tp=2))
    assert parse_layouts(("dp-shard=2, TP=2", "dp_replicate_size=2,dp_shard_size=2")) == (
        Mesh(dp_shard=2, tp=2), Mesh(dp_replicate=2, dp_shard=2))
    assert parse_layouts("tp=2;") == (Mesh(tp=2),)  # a trailing `;` is no layout
    hsdp_tp = Mesh(dp_replicate=2, dp_shard=2, tp=2)
    assert hsdp_tp.world == 8 and hsdp_tp.name == "dp_replicate=2,dp_shard=2,tp=2"
    assert hsdp_tp.slug == "dp_replicate2-dp_shard2-tp2" and batch_replicas(hsdp_tp) == 2
    assert Mesh(cp=2, dp_shard=2).name == "dp_shard=2,cp=2"  # mesh order, whatever order was typed


@pytest.mark.parametrize(("value", "match"), [
    ("tp=0", r"'tp=0': a size is a whole number of 1 or more"),
    ("tp=x", r"'tp=x': a size is a whole number"),
    ("tp=2,tp=2", r"tp is given twice in 'tp=2,tp=2'"),
    ("tp=2;tp=2", r"tp=2 is given twice"),
    (";", r"no layout given"),
    ("tp=2,", r"'tp=2,' is not DIM=SIZE"),
    ("ep=2", r"unknown dimension 'ep'"),
    ("pp=0", r"'pp=0': a size is a whole number of 1 or more"),
    ("tp=1", r"tp=1 is one process"),
])
def test_refusals(value: str, match: str) -> None:
    with pytest.raises(AccelkitError, match=match) as error:
        parse_layouts((value,))
    assert error.value.hint and "\n" not in error.value.message


def test_a_pipeline_is_the_outermost_mesh_dimension() -> None:
    """pp is written last (plan's syntax) but laid out outermost, as the template's (pp, dp_shard, tp) mesh: the
    pipeline's send/recv group is named `pp`; its schedule and microbatches go to pp layouts only."""
    layouts = parse_layouts("dp_shard=4;pp=2,dp_shard=2;PP_size=2,tp=2")
    assert layouts == (Mesh(dp_shard=4), Mesh(pp=2, dp_shard=2), Mesh(pp=2, tp=2))
    fsdp_pp, pp_tp = layouts[1], layouts[2]
    assert fsdp_pp.name == "dp_shard=2,pp=2" and fsdp_pp.slug == "pp2-dp_shard2" and fsdp_pp.world == 4
    assert fsdp_pp.natural_backend == "fsdp" and pp_tp.natural_backend == "ddp"
    assert fsdp_pp.dimension_of(2, 2) == "pp" and fsdp_pp.dimension_of(2, 1) == "dp_shard"
    assert pp_tp.dimension_of(2, 2) == "pp" and pp_tp.dimension_of(2, 1) == "tp"
    # every rank of the template's pipeline reads the global batch: samples are counted once per layout
    assert batch_replicas(fsdp_pp) == 4 and batch_replicas(Mesh(dp_shard=2, tp=2)) == 2
    assert fsdp_pp.option_values() == {"pp_size": 2, "dp_shard_size": 2}
    assert layouts[0].option_values() == {"dp_shard_size": 4}
    with pytest.raises(AccelkitError, match=r"pp=2 is 2 processes but dp_shard=4 is 4"):
        parse_layouts("pp=2;dp_shard=4")


def test_a_process_group_is_named_by_the_mesh_dimension_it_spans() -> None:
    """Ranks are laid out row-major over (dp_replicate, dp_shard, cp, sp, tp): a group's size and rank stride name
    its dimension (the collectives counter records both)."""
    hsdp_tp = Mesh(dp_replicate=2, dp_shard=2, tp=2)  # ranks 0..7; tp = neighbours, dp_shard 2 apart, replicas 4
    assert hsdp_tp.dimension_of(2, 1) == "tp" and hsdp_tp.dimension_of(2, 2) == "dp_shard"
    assert hsdp_tp.dimension_of(2, 4) == "dp_replicate" and hsdp_tp.dimension_of(4, 2) == "dp_replicate_dp_shard"
    assert hsdp_tp.dimension_of(8, 1) == "world" and hsdp_tp.dimension_of(3, 1) is None
    assert hsdp_tp.dimension_of(None, None) is None
    fsdp_cp = Mesh(dp_shard=2, cp=2)
    assert fsdp_cp.dimension_of(2, 1) == "cp" and fsdp_cp.dimension_of(2, 2) == "dp_shard"


def test_collective_keys() -> None:
    from accelkit.bench.comm_count import group_key, parse_key

    assert group_key("all_reduce", (2, 1)) == "all_reduce@2/1" and group_key("all_gather", None) == "all_gather"
    assert parse_key("all_reduce@2/1") == ("all_reduce", 2, 1) and parse_key("all_gather") == ("all_gather", None, None)
