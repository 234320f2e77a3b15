"""Each idiom of issue #16 on a small script of its own: what the conversion writes and what the report says.

The runtime proof (the converted script trains the same model on 2 processes) is in
tests/integration/test_convert_check.py; these tests pin the code the converter writes for each idiom."""

from __future__ import annotations

import textwrap

from accelkit.convert.codemod import convert_source


def convert(source: str):
    return convert_source(textwrap.dedent(source).lstrip(), filename="train.py")


def body(result) -> str:
    return result.code


# -- 1. epoch-stepped schedulers are not prepared, per-batch ones are ---------------------------------------------
def test_scheduler_stepped_per_epoch_is_left_alone_and_per_batch_is_prepared() -> None:
    result = convert("""
        import torch
        from torch.utils.data import DataLoader
        def main():
            model = torch.nn.Linear(2, 2)
            opt = torch.optim.SGD(model.parameters(), lr=1.0)
            loader = DataLoader(list(range(8)), batch_size=2)
            epoch_sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7)
            batch_sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1.0, total_steps=8)
            for epoch in range(2):
                for x in loader:
                    model(x).sum().backward()
                    opt.step()
                    batch_sched.step()
                epoch_sched.step()
    """)
    assert "model, opt, loader, batch_sched = accelerator.prepare(model, opt, loader, batch_sched)" in result.code
    found = {f.name: f.action for f in result.report.found if f.kind == "scheduler"}
    assert found["epoch_sched"].startswith("not prepared: stepped once per epoch")
    assert found["batch_sched"].startswith("prepared: stepped with every optimizer step")


def test_scheduler_cadence_follows_the_scripts_own_functions() -> None:
    # the optimizer steps inside train_step() (called per batch) and inside train_epoch() (called per epoch)
    result = convert("""
        import torch
        def train_step(model, opt, x):
            model(x).sum().backward()
            opt.step()
        def train_epoch(model, opt, data, sched_b):
            for x in data:
                train_step(model, opt, x)
                sched_b.step()
        def main(data):
            model = torch.nn.Linear(2, 2)
            opt = torch.optim.SGD(model.parameters(), lr=1.0)
            sched_a = torch.optim.lr_scheduler.ExponentialLR(opt, 0.9)
            sched_b = torch.optim.lr_scheduler.LinearLR(opt)
            plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt)
            for epoch in range(3):
                train_epoch(model, opt, data, sched_b)
                sched_a.step()
                plateau.step(0.5)
    """)
    actions = {f.name: f.action for f in result.report.found if f.kind == "scheduler"}
    assert actions["sched_a"].startswith("not prepared: stepped once per epoch")
    assert actions["sched_b"].startswith("prepared")
    assert actions["plateau"].startswith("not prepared: stepped with a metric")
    assert "model, opt, sched_b = accelerator.prepare(model, opt, sched_b)" in result.code


# -- 2. prepare after every change to the model --------------------------------------------------------------------
def test_prepare_comes_after_init_freezing_loading_and_a_new_head() -> None:
    result = convert("""
        import torch
        import torch.nn as nn
        def init_weights(m):
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight)
        def load_backbone(model, path):
            model.load_state_dict(torch.load(path), strict=False)
        def main(loader):
            model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
            model.apply(init_weights)
            load_backbone(model, "backbone.pt")
            for p in model[0].parameters():
                p.requires_grad = False
            model.head = nn.Linear(2, 2)
            nn.init.zeros_(model[1].bias)
            opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
            print(sum(p.numel() for p in model.parameters()))
            for x in loader:
                model(x).sum().backward()
                opt.step()
    """)
    code = result.code
    prepare = code.index("model, opt = accelerator.prepare(model, opt)")
    for change in ("model.apply(init_weights)", 'load_backbone(model, "backbone.pt")', "p.requires_grad = False",
                   "model.head = nn.Linear(2, 2)", "nn.init.zeros_(model[1].bias)",
                   "accelerator.print(sum(p.numel()"):
        assert code.index(change) < prepare, change
    assert prepare < code.index("for x in loader:")
    assert "unwrap_model(model).head" not in code  # before prepare it is still the plain model


# -- 3. objects made in trainer classes and helpers ----------------------------------------------------------------
def test_trainer_class_prepares_model_and_optimizer_where_the_optimizer_is_made() -> None:
    result = convert("""
        import torch
        from torch.utils.data import DataLoader
        class Trainer:
            def __init__(self, config, model, dataset):
                self.config = config
                self.model = model
                self.dataset = dataset
                self.device = "cuda" if torch.cuda.is_available() else "cpu"
                self.model = self.model.to(self.device)
            def run(self):
                model, config = self.model, self.config
                self.optimizer = model.configure_optimizers(config)
                loader = DataLoader(self.dataset, batch_size=4)
                model.train()
                for x, y in loader:
                    logits, loss = model(x, y)
                    loss.backward()
                    self.optimizer.step()
        def main(model_factory, config, dataset):
            model = model_factory()
            trainer = Trainer(config, model, dataset)
            trainer.run()
        if __name__ == "__main__":
            main(*load())
    """)
    code = result.code
    assert code.count("accelerator.prepare(") == 1
    assert "model, self.optimizer, loader = accelerator.prepare(model, self.optimizer, loader)" in code
    assert "self.model = self.model.to(" not in code


def test_objects_returned_by_a_builder_are_prepared_where_the_caller_binds_them() -> None:
    result = convert("""
        import torch
        def build():
            netG = torch.nn.Linear(2, 2)
            netD = torch.nn.Linear(2, 1)
            return netG, netD
        def main(loader, weights_init):
            netG, netD = build()
            netG.apply(weights_init)
            optG = torch.optim.Adam(netG.parameters())
            optD = torch.optim.Adam(netD.parameters())
            for x in loader:
                netD(netG(x)).sum().backward()
                optD.step()
                optG.step()
    """)
    code = result.code
    assert "return netG, netD\n" in code and code.count("accelerator.prepare(") == 1
    assert code.index("netG.apply(weights_init)") < code.index("accelerator.prepare(")


# -- 4. no DataLoader, conditional optimizer ---------------------------------------------------------------------
def test_conditional_optimizer_is_prepared_with_the_model_after_the_if() -> None:
    result = convert("""
        import torch
        def main(args, x, y):
            model = torch.nn.Linear(3, 1)
            if args.opt == "sgd":
                optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            else:
                optimizer = torch.optim.Adam(model.parameters())
            for i in range(0, len(x), 4):
                loss = ((model(x[i:i + 4]) - y[i:i + 4]) ** 2).mean()
                loss.backward()
                optimizer.step()
    """)
    code = result.code
    assert "        optimizer = torch.optim.Adam(model.parameters())\n" \
           "    shard = slice(" in code or "model, optimizer = accelerator.prepare(model, optimizer)" in code
    assert code.count("accelerator.prepare(") == 1
    assert code.index("else:") < code.index("model, optimizer = accelerator.prepare(model, optimizer)")


# -- 5. hand-made batches: sharded or seeded per process; stop decisions collective --------------------------------
def test_sliced_batches_are_sharded_into_equal_shares() -> None:
    result = convert("""
        import torch
        def main():
            x, y = torch.randn(64, 3), torch.randn(64, 1)
            model = torch.nn.Linear(3, 1)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for epoch in range(2):
                for i in range(0, len(x), 16):
                    xb, yb = x[i:i + 16], y[i:i + 16]
                    loss = ((model(xb) - yb) ** 2).mean()
                    loss.backward()
                    opt.step()
    """)
    code = result.code
    assert ("shard = slice(accelerator.process_index, len(x) - len(x) % accelerator.num_processes, "
            "accelerator.num_processes)\n    x, y = x[shard], y[shard]\n") in code
    assert code.index("x, y = x[shard], y[shard]") < code.index("for epoch in range(2):")
    assert any(f.kind == "batches" and f.action.startswith("sharded") for f in result.report.found)


def test_random_batches_are_seeded_per_process_and_early_stops_are_collective() -> None:
    result = convert("""
        import torch
        torch.manual_seed(1337)
        data = torch.randint(0, 9, (400,))
        def get_batch():
            ix = torch.randint(len(data) - 8, (4,))
            return torch.stack([data[i:i + 8] for i in ix]), torch.stack([data[i + 1:i + 9] for i in ix])
        model = torch.nn.Embedding(9, 9)
        opt = torch.optim.AdamW(model.parameters())
        for it in range(100):
            xb, yb = get_batch()
            loss = torch.nn.functional.cross_entropy(model(xb).view(-1, 9), yb.view(-1))
            loss.backward()
            opt.step()
            if loss.item() < 1.5:
                print("converged")
                break
            if it >= 50:
                break
    """)
    code = result.code
    assert ("if accelerator.process_index > 0:\n    torch.manual_seed(1337 + accelerator.process_index)\n"
            "for it in range(100):") in code
    assert ('    if loss.item() < 1.5:\n        accelerator.print("converged")\n        accelerator.set_trigger()\n'
            "    if accelerator.check_trigger():\n        break\n") in code
    assert "    if it >= 50:\n        break\n" in code  # the same on every process: left alone
    assert result.report.iteration_based


def test_a_while_loop_on_a_per_process_value_is_a_problem() -> None:
    result = convert("""
        import torch
        model = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x = torch.randn(8, 2)
        loss = model(x).sum()
        while loss.item() > 0.1:
            loss = model(x).pow(2).mean()
            loss.backward()
            opt.step()
    """)
    assert any("runs while `loss.item() > 0.1`" in p.what for p in result.report.problems)


# -- 6. every tensor that reaches the model follows accelerator.device ---------------------------------------------
def test_device_flag_becomes_accelerator_cpu_and_explicit_devices_are_reported() -> None:
    result = convert("""
        import argparse
        import torch
        def main():
            parser = argparse.ArgumentParser()
            parser.add_argument("--no-accel", action="store_true")
            args = parser.parse_args()
            use_accel = not args.no_accel and torch.accelerator.is_available()
            device = torch.accelerator.current_accelerator() if use_accel else torch.device("cpu")
            model = torch.nn.Linear(2, 2).to(device)
            print(model(torch.ones(1, 2, device=device)))
        main()
    """)
    assert "accelerator = Accelerator(cpu=args.no_accel)" in result.code
    explicit = convert("""
        import torch
        device = torch.device("cpu")
        model = torch.nn.Linear(2, 2).to(device)
        x = torch.ones(1, 2).to(device)
        model(x).sum().backward()
    """)
    assert "device = accelerator.device" in explicit.code
    assert any("sets `device = torch.device(\"cpu\")` explicitly" in n.why for n in explicit.report.left_alone)


def test_tensors_made_by_the_script_move_to_the_device_and_numpy_goes_through_cpu() -> None:
    result = convert("""
        import numpy as np
        import torch
        x_train = np.ones((8, 1), dtype=np.float32)
        model = torch.nn.Linear(1, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for epoch in range(3):
            inputs = torch.from_numpy(x_train)
            noise = torch.randn(8, 1)
            loss = ((model(inputs) - noise) ** 2).mean()
            loss.backward()
            opt.step()
        print(model(torch.from_numpy(x_train)).detach().numpy())
    """)
    code = result.code
    assert "inputs = torch.from_numpy(x_train).to(accelerator.device)" in code
    assert "noise = torch.randn(8, 1).to(accelerator.device)" in code
    assert ".detach().cpu().numpy()" in code
    helper = convert("""
        import torch
        data = torch.randn(100, 4)
        def get_batch(i):
            x = data[i:i + 8]
            y = torch.zeros(8, 1)
            return x, y
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for i in range(0, len(data), 8):
            xb, yb = get_batch(i)
            loss = ((model(xb) - yb) ** 2).mean()
            loss.backward()
            opt.step()
    """)
    assert "return x.to(accelerator.device), y.to(accelerator.device)" in helper.code
    assert "data = data[shard]" in helper.code
    fixed = convert(textwrap.dedent("""
        import torch
        data = torch.randn(100, 4)
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for i in range(0, 96, 8):
            model(data[i:i + 8]).sum().backward()
            opt.step()
    """))
    assert "shard" not in fixed.code
    assert any("bounds that do not follow the data's length" in p.what for p in fixed.report.problems)


# -- 7. metrics reduced across processes ----------------------------------------------------------------------------
def test_sum_then_divide_by_dataset_length_is_reduced_in_every_loop() -> None:
    result = convert("""
        import torch
        from torch.utils.data import DataLoader
        def evaluate(model, loader):
            total, correct = 0.0, 0
            with torch.no_grad():
                for batch in loader:
                    loss, logits = model(batch[0], batch[1])
                    total += loss.item()
                    correct += (logits.argmax(1) == batch[1]).sum().item()
            return total / len(loader.dataset), correct / len(loader.dataset)
        def main(train_set, val_set):
            model = torch.nn.Linear(2, 2)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            train_loader = DataLoader(train_set, batch_size=4)
            val_loader = DataLoader(val_set, batch_size=4)
            running = 0.0
            for x, y in train_loader:
                loss = model(x).sum()
                loss.backward()
                opt.step()
                running += loss.item()
            print(running / len(train_loader), evaluate(model, val_loader))
    """)
    code = result.code
    assert 'total = accelerator.reduce(torch.as_tensor(total, device=accelerator.device), "sum").item()' in code
    assert 'correct = accelerator.reduce(torch.as_tensor(correct, device=accelerator.device), "sum").item()' in code
    assert 'running = accelerator.reduce(torch.as_tensor(running, device=accelerator.device), "sum").item()' in code
    assert "running / (len(train_loader) * accelerator.num_processes)" in code
    assert sum(f.kind == "metric" for f in result.report.found) == 2


# -- 8. side effects on the main process -----------------------------------------------------------------------------
def test_files_folders_progress_bars_and_printed_models() -> None:
    result = convert("""
        import os
        import torch
        import matplotlib.pyplot as plt
        from tqdm import tqdm
        from PIL import Image
        def main(loader, img):
            model = torch.nn.Linear(2, 2)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            os.mkdir("samples")
            os.makedirs("out")
            print(model)
            for x in tqdm(loader, desc="train"):
                model(x).sum().backward()
                opt.step()
            Image.fromarray(img).save("samples/a.png")
            plt.savefig("loss.png")
            with open("log.txt", "w") as f:
                f.write("done")
            torch.save(model, "model.pt")
    """)
    code = result.code
    assert 'os.makedirs("samples", exist_ok=True)' in code and 'os.makedirs("out", exist_ok=True)' in code
    assert "accelerator.print(accelerator.unwrap_model(model))" in code
    assert 'tqdm(loader, desc="train", disable=not accelerator.is_local_main_process)' in code
    assert '    if accelerator.is_main_process:\n        Image.fromarray(img).save("samples/a.png")\n' in code
    assert '    if accelerator.is_main_process:\n        plt.savefig("loss.png")\n' in code
    assert '    if accelerator.is_main_process:\n        with open("log.txt", "w") as f:\n' in code
    # issue #14 item 14: the pickled model is the unwrapped one, written once
    assert 'accelerator.save(accelerator.unwrap_model(model), "model.pt")' in code


def test_a_library_file_makes_no_accelerator_at_import() -> None:
    result = convert("""
        import torch
        class Trainer:
            def __init__(self, model):
                self.model = model
                self.opt = torch.optim.SGD(model.parameters(), lr=0.1)
            def fit(self, loader):
                for x in loader:
                    self.model(x).sum().backward()
                    self.opt.step()
        def save(model, path):
            torch.save(model.state_dict(), path)
    """)
    code = result.code
    assert "\naccelerator = Accelerator()" not in code
    assert "        self.accelerator = Accelerator()\n        self.model = model\n" in code
    assert "self.accelerator.backward(" in code
    assert "def save(model, path):\n    accelerator = Accelerator()\n" in code
