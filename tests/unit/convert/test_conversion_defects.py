"""The defects issue #23 found in conversions (read by an Accelerate expert, run on 1 and 2 processes), each on a
small script of its own shape: what the conversion now writes, and what `convert` itself refuses or flags."""

from __future__ import annotations

import textwrap

from accelkit.convert.codemod import convert_source
from accelkit.convert.verify import find_concerns


def convert(source: str):
    return convert_source(textwrap.dedent(source).lstrip(), filename="train.py")


MAIN_GUARD = """
    import numpy as np
    import torch
    import torch.nn as nn
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if __name__ == "__main__":
        data = np.random.RandomState(0).randn(16, 3).astype(np.float32)
        x = torch.from_numpy(data).to(device)
        y = torch.from_numpy(data.sum(1, keepdims=True)).to(device)
        model = nn.Linear(3, 1).to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for epoch in range(3):
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
"""


def test_prepare_goes_inside_the_main_guard_before_the_training_loop() -> None:
    result = convert(MAIN_GUARD)
    code = result.code
    prepare = code.index("    model, optimizer = accelerator.prepare(model, optimizer)\n")
    assert prepare < code.index("    for epoch in range(3):")
    assert not result.report.problems
    found = {f.kind: f.action for f in result.report.found}
    assert 'prepared at line 11 (`if __name__ == "__main__":`)' in found["model"]


def test_full_batch_numpy_input_and_its_targets_are_sharded_together() -> None:
    code = convert(MAIN_GUARD).code
    assert "    x, y = x[shard], y[shard]\n" in code
    assert code.index("x, y = x[shard]") < code.index("for epoch in range(3):")


def test_barrier_stays_outside_the_main_process_branch_of_a_file_handle_save() -> None:
    result = convert("""
        import torch
        model = torch.nn.Linear(2, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(2):
            model(torch.ones(2)).sum().backward()
            opt.step()
        with open("model.pt", "wb") as f:
            torch.save(model, f)
    """)
    assert ("accelerator.wait_for_everyone()\nif accelerator.is_main_process:\n"
            "    with open(\"model.pt\", \"wb\") as f:\n"
            "        accelerator.save(accelerator.unwrap_model(model), f)\naccelerator.wait_for_everyone()\n") \
        in result.code
    assert not [p for p in result.report.problems if "wait_for_everyone" in p.what]


def test_device_string_comparisons_compare_the_device_type() -> None:
    code = convert("""
        import torch
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        model = torch.nn.Linear(2, 2).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.ones(2, device=device)).sum().backward()
        opt.step()
        use_amp = device == "cuda"
        if "cuda:0" != device:
            pass
    """).code
    assert "use_amp = device.type == \"cuda\"\n" in code
    assert "if \"cuda:0\" != str(device):" in code


def test_a_string_device_stays_a_string() -> None:
    # nanoGPT: `device = 'cuda'` is a config value its configurator overrides with `--device=cpu` after asserting the
    # type; `"cuda" in device` and `device == "cuda"` are string tests that must keep working
    code = convert("""
        import torch
        device = 'cuda'
        exec(open('configurator.py').read())
        model = torch.nn.Linear(2, 2).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.ones(2, device=device)).sum().backward()
        opt.step()
        use_amp = device == "cuda"
        device_kind = "gpu" if "cuda" in device else "cpu"
    """).code
    assert "device = accelerator.device.type\n" in code  # "cuda" is the process's own GPU (current device)
    assert 'use_amp = device == "cuda"\n' in code and '"cuda" in device' in code


def test_tensors_made_in_forward_follow_the_input_device() -> None:
    code = convert("""
        import torch
        import torch.nn as nn
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.rnn = nn.GRU(3, 4)
            def forward(self, x):
                h = torch.zeros(1, x.size(1), 4)
                mask = torch.ones(3).to(x.device)
                return self.rnn(x, h)[0]
        model = Net()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.ones(2, 1, 3)).sum().backward()
        opt.step()
    """).code
    assert "h = torch.zeros(1, x.size(1), 4, device=x.device)\n" in code
    assert "mask = torch.ones(3).to(x.device)\n" in code


def test_noise_drawn_in_a_loader_loop_is_seeded_per_process_even_without_a_seed() -> None:
    # torch starts every process from the same default seed: unseeded noise is the same on every rank too
    result = convert("""
        import torch
        from torch.utils.data import DataLoader
        netG = torch.nn.Linear(4, 2)
        opt = torch.optim.Adam(netG.parameters())
        loader = DataLoader(torch.randn(16, 2), batch_size=4)
        for epoch in range(2):
            for real in loader:
                noise = torch.randn(real.size(0), 4)
                (netG(noise) - real).pow(2).mean().backward()
                opt.step()
    """)
    assert ("if accelerator.process_index > 0:\n    torch.manual_seed(torch.initial_seed() + "
            "accelerator.process_index)\nfor epoch in range(2):") in result.code
    assert any(f.kind == "random" for f in result.report.found)


def test_downloads_run_main_process_first_and_progress_lines_on_the_main_process() -> None:
    code = convert("""
        import sys
        import torch
        import torchvision
        from torch.utils.data import DataLoader
        train_set = torchvision.datasets.MNIST("data", train=True, download=True)
        loader = DataLoader(train_set, batch_size=8)
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for i, (x, y) in enumerate(loader):
            model(x).sum().backward()
            opt.step()
            sys.stdout.write(f"\\r{i}")
    """).code
    assert ("with accelerator.main_process_first():\n    train_set = torchvision.datasets.MNIST(\"data\", train=True, "
            "download=True)\n") in code
    assert "    if accelerator.is_local_main_process:\n        sys.stdout.write(" in code


def test_a_save_inside_a_downloading_dataset_gets_no_barrier() -> None:
    # under main_process_first the main process runs it alone: a barrier there would wait for the others forever
    code = convert("""
        import torch
        from torch.utils.data import DataLoader, Dataset
        class Data(Dataset):
            def __init__(self, root, download=False):
                if download:
                    torch.save(torch.ones(4, 2), root)
                self.x = torch.load(root)
        loader = DataLoader(Data("d.pt", download=True), batch_size=2)
        model = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x in loader:
            model(x).sum().backward()
            opt.step()
    """).code
    assert "wait_for_everyone" not in code
    assert "accelerator.save(torch.ones(4, 2), root)" in code


def test_gathered_metrics_gather_the_inputs_they_weigh_by() -> None:
    code = convert("""
        import torch
        from torch.utils.data import DataLoader
        model = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        test_loader = DataLoader([(torch.ones(2), torch.ones(1))] * 6, batch_size=4)
        total = 0.0
        with torch.no_grad():
            for xb, yb in test_loader:
                pred = model(xb)
                total += torch.nn.functional.mse_loss(pred, yb).item() * xb.size(0)
        print(total / len(test_loader.dataset))
    """).code
    assert "pred, yb, xb = accelerator.gather_for_metrics((pred, yb, xb))" in code


# -- what convert refuses statically ------------------------------------------------------------------------------
def test_verify_flags_a_barrier_under_a_rank_condition_and_prepare_after_training() -> None:
    findings = find_concerns(textwrap.dedent("""
        accelerator = Accelerator()
        if accelerator.is_main_process:
            accelerator.wait_for_everyone()
        for step in range(2):
            accelerator.backward(model(x).sum())
        model, opt = accelerator.prepare(model, opt)
        def report(rank):
            if rank == 0:
                total = accelerator.reduce(t)
            if accelerator.is_main_process:
                accelerator.save(model, "m.pt")
    """))
    assert [(f.line, f.what.split(" ")[0]) for f in findings] == [
        (4, "`accelerator.wait_for_everyone()`"), (10, "`accelerator.reduce()`"), (7, "`accelerator.prepare(...)`")]
    assert "after line 5, which already trains model" in findings[2].what


def test_a_conversion_that_would_hang_is_not_written_silently() -> None:
    # the script's own rank guard around a collective it calls through a helper the converter rewrites
    result = convert("""
        import torch
        from torch.utils.data import DataLoader
        model = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = DataLoader(torch.ones(8, 2), batch_size=2)
        for x in loader:
            model(x).sum().backward()
            opt.step()
        is_master = True
        if is_master:
            total = 0.0
            for x in loader:
                out = model(x)
                total += out.sum().item()
            print(total)
    """)
    assert any("runs only under `if is_master:`" in p.what for p in result.report.problems)


def test_a_sum_of_per_batch_mean_losses_is_summed_per_process_not_gathered() -> None:
    # gathered, each term would be the mean over N processes' batches, and there would be N times fewer terms
    code = convert("""
        import torch
        from torch.utils.data import DataLoader
        model = torch.nn.Linear(2, 1)
        criterion = torch.nn.MSELoss()
        test_loader = DataLoader([(torch.ones(2), torch.ones(1))] * 6, batch_size=4)
        total = 0.0
        with torch.no_grad():
            for xb, yb in test_loader:
                pred = model(xb)
                total += criterion(pred, yb).item()
        print(total / len(test_loader))
    """).code
    assert "gather_for_metrics" not in code
    assert 'total = accelerator.reduce(torch.as_tensor(total, device=accelerator.device), "sum").item()' in code
    assert "print(total / (len(test_loader) * accelerator.num_processes))" in code
