"""Issue #23: torch.distributed (torchrun + DDP) scripts become Accelerate scripts; what cannot be followed is
still refused."""

from __future__ import annotations

import textwrap

import pytest

from accelkit.convert.codemod import convert_source
from accelkit.errors import AccelkitError


def convert(source: str):
    return convert_source(textwrap.dedent(source).lstrip(), filename="train.py")


TORCHRUN = """
    import os
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler

    def main():
        dist.init_process_group("nccl")
        local_rank = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local_rank)
        rank = dist.get_rank()
        world = dist.get_world_size()
        device = torch.device(f"cuda:{local_rank}")
        model = DDP(torch.nn.Linear(4, 2).to(device), device_ids=[local_rank], find_unused_parameters=True)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        data = torch.randn(32, 4)
        sampler = DistributedSampler(data, shuffle=True)
        loader = DataLoader(data, batch_size=4, sampler=sampler, shuffle=False)
        for epoch in range(2):
            sampler.set_epoch(epoch)
            for step, x in enumerate(loader):
                x = x.to(device)
                if step % 2 == 0:
                    with model.no_sync():
                        model(x).sum().backward()
                    continue
                model(x).sum().backward()
                opt.step()
            total = torch.tensor([1.0], device=device)
            dist.all_reduce(total, op=dist.ReduceOp.SUM)
            best = torch.tensor([2.0])
            dist.all_reduce(best, op=dist.ReduceOp.MAX)
            count = torch.tensor([3.0])
            dist.reduce(count, 0)
            outs = [torch.zeros(1) for _ in range(world)]
            dist.all_gather(outs, total)
            if rank == 0:
                torch.save(model.module.state_dict(), "m.pt")
            dist.barrier()
        dist.destroy_process_group()

    if __name__ == "__main__":
        main()
"""


@pytest.fixture(scope="module")
def torchrun():
    return convert(TORCHRUN)


def test_process_group_setup_and_teardown_go(torchrun) -> None:
    code = torchrun.code
    assert "init_process_group" not in code and "destroy_process_group" not in code and "set_device" not in code
    assert "import torch.distributed as dist" not in code and "DistributedDataParallel as DDP" not in code
    assert "dist." not in code
    assert not torchrun.report.problems


def test_rank_and_world_size_come_from_the_accelerator(torchrun) -> None:
    code = torchrun.code
    assert "    local_rank = accelerator.local_process_index\n" in code
    assert "    rank = accelerator.process_index\n    world = accelerator.num_processes\n" in code
    assert "    device = accelerator.device\n" in code


def test_ddp_wrap_goes_and_its_options_reach_the_accelerator(torchrun) -> None:
    code = torchrun.code
    assert "DDP(" not in code and "    model = torch.nn.Linear(4, 2)\n" in code
    assert "from accelerate import Accelerator, DistributedDataParallelKwargs\n" in code
    assert "Accelerator(kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)])" in code
    assert "model, opt, loader = accelerator.prepare(model, opt, loader)" in code


def test_distributed_sampler_becomes_the_loaders_shuffle(torchrun) -> None:
    code = torchrun.code
    assert "DistributedSampler" not in code and "set_epoch" not in code
    assert "    loader = DataLoader(data, batch_size=4, shuffle=True)\n" in code


def test_no_sync_accumulation_and_step_counter_stay_as_written(torchrun) -> None:
    code = torchrun.code
    assert "with accelerator.no_sync(model):" in code
    # `step` of enumerate(loader) counts alike on every process: no trigger around the accumulation's continue
    assert "set_trigger" not in code and "            if step % 2 == 0:\n" in code


def test_collectives_on_metrics_become_accelerates_in_place(torchrun) -> None:
    code = torchrun.code
    assert '        total.copy_(accelerator.reduce(total, "sum"))\n' in code
    assert "        best.copy_(accelerator.gather(best[None]).amax(0))\n" in code
    assert '        count.copy_(accelerator.reduce(count, "sum"))\n' in code  # every process gets dst's value
    assert "        outs[:] = accelerator.gather(total[None]).unbind(0)\n" in code
    assert "        accelerator.wait_for_everyone()\n" in code


def test_the_state_dict_of_a_rank_guarded_save_is_gathered_by_every_process(torchrun) -> None:
    # under FSDP / ZeRO-3 the full state dict is a collective: asked for under `if rank == 0:` alone, it hangs
    assert ("        model_state_dict = accelerator.get_state_dict(model)\n        if rank == 0:\n"
            "            accelerator.save(model_state_dict, \"m.pt\")\n") in torchrun.code


def test_nanogpt_ddp_or_single_becomes_one_path() -> None:
    code = convert("""
        import os
        import torch
        from torch.distributed import init_process_group, destroy_process_group
        from torch.nn.parallel import DistributedDataParallel as DDP
        device = "cuda"
        ddp = int(os.environ.get("RANK", -1)) != -1
        if ddp:
            init_process_group(backend="nccl")
            ddp_local_rank = int(os.environ["LOCAL_RANK"])
            device = f"cuda:{ddp_local_rank}"
            torch.cuda.set_device(device)
            master_process = int(os.environ["RANK"]) == 0
        else:
            master_process = True
        device_type = "cuda" if "cuda" in device else "cpu"
        model = torch.nn.Linear(2, 2)
        model.to(device)
        model = torch.compile(model)
        opt = torch.optim.AdamW(model.parameters())
        if ddp:
            model = DDP(model, device_ids=[ddp_local_rank])
        raw_model = model.module if ddp else model
        for it in range(3):
            for micro in range(2):
                if ddp:
                    model.require_backward_grad_sync = micro == 1
                model(torch.ones(2, device=device)).sum().backward()
            opt.step()
        if ddp:
            destroy_process_group()
    """).code
    assert "ddp = accelerator.process_index != -1\n" in code  # always true: one path for 1 or N processes
    assert "device = accelerator.device.type\n" in code and "    device = str(accelerator.device)\n" in code
    assert 'device_type = accelerator.device.type\n' in code
    assert "    master_process = accelerator.process_index == 0\n" in code
    assert "model = torch.compile(model)\n" in code and "DDP(" not in code
    assert "raw_model = accelerator.unwrap_model(model) if ddp else model\n" in code
    assert "            model.require_backward_grad_sync = micro == 1\n" in code  # the DDP wrapper's own switch
    assert "process_group" not in code


@pytest.mark.parametrize(("source", "reason"), [
    ("import torch.multiprocessing as mp\nmp.spawn(train, nprocs=2)\n", "spawns its own worker processes"),
    ("import deepspeed\nengine, *_ = deepspeed.initialize(model=m)\n", "deepspeed.initialize"),
])
def test_what_it_cannot_follow_is_still_refused(source: str, reason: str) -> None:
    with pytest.raises(AccelkitError, match=reason):
        convert_source(source)
