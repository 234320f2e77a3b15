"""Issue #31: idioms of public training scripts the converter got wrong (a conversion that was not data-parallel,
crashed or hung on 2 ranks, or a false refusal), each on a small script of our own in that shape."""

from __future__ import annotations

import textwrap

from helpers import DATA

from accelkit.convert.codemod import convert_source
from accelkit.convert.verify import find_concerns


def convert(source: str):
    return convert_source(textwrap.dedent(source).lstrip(), filename="train.py")


def test_a_module_level_loop_with_a_model_built_in_branches_is_prepared() -> None:
    # nanoGPT's train.py: no functions, the model made in `if init_from == ...` branches and imported from a local
    # module, the optimizer from `model.configure_optimizers(...)`, `DDP(model)` under `if ddp:`
    result = convert("""
        import os
        import torch
        from torch.nn.parallel import DistributedDataParallel as DDP
        from mymodel import Net
        init_from = "scratch"
        ddp = int(os.environ.get("RANK", -1)) != -1
        if init_from == "scratch":
            model = Net()
        elif init_from == "resume":
            model = Net()
            model.load_state_dict(torch.load("ckpt.pt"))
        optimizer = model.configure_optimizers(0.1)
        if ddp:
            model = DDP(model)
        raw_model = model.module if ddp else model
        it = 0
        while True:
            loss = model(torch.randn(4, 2)).sum()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            it += 1
            if it > 10:
                break
    """)
    assert "model, optimizer = accelerator.prepare(model, optimizer)\n" in result.code
    assert "raw_model = accelerator.unwrap_model(model) if ddp else model\n" in result.code
    assert result.code.index("accelerator.prepare(") < result.code.index("while True:")
    assert not result.report.problems


def test_a_print_at_import_time_stays_a_print_when_the_accelerator_is_made_in_main() -> None:
    # `accelerator.print` at module level, with `accelerator` created inside main(): a NameError at import
    result = convert("""
        import argparse
        import torch
        print("starting")
        def main():
            parser = argparse.ArgumentParser()
            args = parser.parse_args()
            model = torch.nn.Linear(2, 1)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            loader = torch.utils.data.DataLoader(torch.ones(8, 2), batch_size=2)
            for x in loader:
                model(x).sum().backward()
                opt.step()
            print("done")
        if __name__ == "__main__":
            main()
    """)
    assert result.code.startswith("import argparse\nimport torch\nfrom accelerate import Accelerator\nprint(")
    assert '    accelerator.print("done")' in result.code
    assert not result.report.problems


def test_a_loader_sampler_set_epoch_goes_with_an_inline_distributed_sampler() -> None:
    # a torchrun script: `sampler=DistributedSampler(ds)` inline, then `loader.sampler.set_epoch(epoch)`; the prepared
    # loader's sampler has no set_epoch (AttributeError on the first epoch)
    code = convert("""
        import torch
        import torch.distributed as dist
        from torch.utils.data import DataLoader
        from torch.utils.data.distributed import DistributedSampler
        dist.init_process_group("gloo")
        ds = torch.utils.data.TensorDataset(torch.ones(8, 2))
        loader = DataLoader(ds, batch_size=2, sampler=DistributedSampler(ds, shuffle=True))
        model = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for epoch in range(2):
            loader.sampler.set_epoch(epoch)
            for (x,) in loader:
                model(x).sum().backward()
                opt.step()
    """).code
    assert "set_epoch" not in code and "DistributedSampler" not in code
    assert "shuffle=True" in code


def test_verify_refuses_a_conversion_that_trains_but_prepares_nothing() -> None:
    findings = find_concerns(textwrap.dedent("""
        accelerator = Accelerator()
        model = build()
        for x in data:
            accelerator.backward(model(x).sum())
    """))
    assert [f.line for f in findings] == [5]
    assert "no model is passed to `accelerator.prepare(...)`" in findings[0].what
    assert "not data-parallel" in findings[0].what


def test_verify_refuses_prepare_of_self_inside_the_model_class() -> None:
    findings = find_concerns(textwrap.dedent("""
        accelerator = Accelerator()
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.opt = torch.optim.SGD(self.parameters(), lr=0.1)
                self, self.opt = accelerator.prepare(self, self.opt)
    """))
    assert [f.line for f in findings] == [7]
    assert "`accelerator.prepare(self, ...)` inside the model's own class" in findings[0].what


def test_verify_refuses_accelerator_used_at_import_before_it_exists() -> None:
    findings = find_concerns(textwrap.dedent("""
        import torch
        accelerator.print("hello")
        def main():
            accelerator = Accelerator()
            accelerator.print("inside")
        if __name__ == "__main__":
            main()
    """))
    assert [f.line for f in findings] == [3]
    assert "NameError" in findings[0].what
    # created first, used after: nothing to say
    assert not find_concerns("accelerator = Accelerator()\nif True:\n    accelerator.print(1)\n")


def test_a_best_checkpoint_save_decided_by_each_process_gets_no_barrier() -> None:
    # `if val_loss < best: torch.save(...)`: each process compares its own loss; barriers in that branch would
    # leave the processes that skip it waiting. A save under a flag (`if args.save:`) keeps its barriers.
    code = convert("""
        import argparse
        import torch
        parser = argparse.ArgumentParser()
        parser.add_argument("--save", action="store_true")
        args = parser.parse_args()
        model = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = torch.utils.data.DataLoader(torch.ones(8, 2), batch_size=2)
        best = float("inf")
        for epoch in range(3):
            for x in loader:
                loss = model(x).sum()
                loss.backward()
                opt.step()
            val_loss = loss.item()
            if val_loss < best:
                best = val_loss
                torch.save(model.state_dict(), "best.pt")
            if args.save and epoch % 2 == 0:
                torch.save(model.state_dict(), "last.pt")
    """).code
    best = code[code.index("if val_loss < best:"):code.index("if args.save")]
    flag = code[code.index("if args.save"):]
    assert "wait_for_everyone" not in best and "accelerator.save(" in best
    assert flag.count("accelerator.wait_for_everyone()") == 2


def test_a_loader_returned_by_another_module_is_prepared() -> None:
    # `train_loader, val_loader = get_loaders(...)` from the project's own data module: the converter cannot see
    # into it, but the names and the loops say what they are; left alone, every process trained on all the data
    result = convert("""
        import torch
        from data import get_loaders
        def main():
            train_loader, val_loader = get_loaders(batch_size=8)
            model = torch.nn.Linear(4, 1)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for epoch in range(2):
                for x, y in train_loader:
                    torch.nn.functional.mse_loss(model(x), y).backward()
                    opt.step()
                for x, y in val_loader:
                    out = model(x)
        if __name__ == "__main__":
            main()
    """)
    assert "model, opt, train_loader, val_loader = accelerator.prepare(" in result.code.replace("\n        ", "")
    assert not result.report.problems


def test_a_label_alias_taken_before_the_forward_is_not_left_local() -> None:
    # `target = y` before the forward and compared after it: gathering (out, y) would compare the whole batch's
    # predictions with this process's labels (a batch-size mismatch); the alias is gathered with the outputs instead
    # (it used to be left out of the gather and the count summed across processes)
    code = convert("""
        import torch
        model = torch.nn.Linear(4, 3)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        ds = torch.utils.data.TensorDataset(torch.randn(16, 4, generator=torch.Generator().manual_seed(0)),
                                            torch.zeros(16, dtype=torch.long))
        loader = torch.utils.data.DataLoader(ds, batch_size=4)
        for x, y in loader:
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        correct = 0
        with torch.no_grad():
            for x, y in loader:
                target = y
                out = model(x)
                correct += (out.argmax(1) == target).sum().item()
        print(correct / len(loader.dataset))
    """).code
    assert "out, target = accelerator.gather_for_metrics((out, target))" in code
    assert "accelerator.reduce" not in code  # the gathered count covers every process already


def test_a_label_renamed_before_the_forward_is_gathered_with_the_batch() -> None:
    # akamaster/pytorch_resnet_cifar10: `target_var = target.cuda()` before the forward, the loss and an
    # AverageMeter's accuracy computed from it after, weighted by `input.size(0)`: the rename is gathered too (it was
    # left local, and rank 0's accuracy printed as the whole set's)
    code = convert("""
        import torch
        model = torch.nn.Linear(4, 3)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        criterion = torch.nn.CrossEntropyLoss()
        ds = torch.utils.data.TensorDataset(torch.randn(16, 4), torch.zeros(16, dtype=torch.long))
        loader = torch.utils.data.DataLoader(ds, batch_size=4)
        for x, y in loader:
            criterion(model(x), y).backward()
            opt.step()
        with torch.no_grad():
            for input, target in loader:
                input_var = input.cuda()
                target_var = target.cuda()
                output = model(input_var)
                loss = criterion(output, target_var)
                meter.update((output.argmax(1) == target_var).float().mean().item(), input.size(0))
    """).code
    assert "output, input, target_var = accelerator.gather_for_metrics((output, input, target_var))" in code


def test_a_count_taken_from_the_batch_before_the_forward_still_stops_the_gather() -> None:
    # `n = y.size(0)` is not a rename of the batch: it would stay this process's count next to gathered predictions
    code = convert("""
        import torch
        model = torch.nn.Linear(4, 3)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        ds = torch.utils.data.TensorDataset(torch.randn(16, 4), torch.zeros(16, dtype=torch.long))
        loader = torch.utils.data.DataLoader(ds, batch_size=4)
        for x, y in loader:
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        correct = seen = 0
        with torch.no_grad():
            for x, y in loader:
                n = y.size(0)
                out = model(x)
                correct += (out.argmax(1) == y).sum().item()
                seen += n
        print(correct / seen)
    """).code
    assert "gather_for_metrics" not in code
    assert 'seen = accelerator.reduce(torch.as_tensor(seen, device=accelerator.device), "sum")' in code


def test_verify_refuses_a_loader_prepared_after_a_loop_over_it() -> None:
    findings = find_concerns(textwrap.dedent("""
        accelerator = Accelerator()
        model, opt = accelerator.prepare(model, opt)
        for x, y in enumerate(test_loader):
            model(x)
        test_loader = accelerator.prepare(test_loader)
    """))
    assert [f.line for f in findings] == [6]
    assert "comes after line 4, which already iterates test_loader" in findings[0].what


def test_an_archive_is_unpacked_by_the_main_process_first_with_its_existence_test() -> None:
    # every process unpacking one archive into one folder at once; the `if not os.path.exists(...)` goes inside
    # main_process_first too (the others find the folder made, and no process skips the barrier alone)
    code = convert("""
        import os
        import tarfile
        import torch
        if not os.path.exists("data/train"):
            with tarfile.open("data.tgz") as tar:
                tar.extractall("data")
        model = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = torch.utils.data.DataLoader(torch.ones(8, 2), batch_size=2)
        for x in loader:
            model(x).sum().backward()
            opt.step()
    """).code
    assert 'with accelerator.main_process_first():\n    if not os.path.exists("data/train"):\n' in code


def test_a_train_function_defined_before_the_prepare_is_no_false_refusal() -> None:
    # `def train(): ...` written (not run) before the prepare point and called after it
    findings = find_concerns(textwrap.dedent("""
        accelerator = Accelerator()
        if __name__ == "__main__":
            def train():
                for x in loader:
                    accelerator.backward(model(x).sum())
            model, opt, loader = accelerator.prepare(model, opt, loader)
            train()
    """))
    assert findings == []


def test_an_assert_that_cuda_is_available_goes() -> None:
    result = convert("""
        import torch
        assert torch.cuda.is_available(), "this script needs a GPU"
        model = torch.nn.Linear(2, 1).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = torch.utils.data.DataLoader(torch.ones(8, 2), batch_size=2)
        for x in loader:
            model(x.cuda()).sum().backward()
            opt.step()
    """)
    assert "assert" not in result.code and "is_available" not in result.code


def test_hogwild_worker_processes_are_refused() -> None:
    import pytest

    from accelkit.errors import AccelkitError

    with pytest.raises(AccelkitError, match=r"worker processes it starts itself .* \(line 5\)"):
        convert("""
            import torch
            import torch.multiprocessing as mp
            model = torch.nn.Linear(2, 1)
            model.share_memory()
            p = mp.Process(target=train, args=(model,))
            p.start()
        """)


def test_an_amp_context_object_and_its_scaler_are_kept() -> None:
    # nanoGPT: `ctx = nullcontext() if cpu else torch.amp.autocast(...)`, `GradScaler(enabled=(dtype == "float16"))`
    # with dtype chosen at run time (bf16 where supported): no hard-coded Accelerator(mixed_precision="fp16")
    result = convert("""
        from contextlib import nullcontext
        import torch
        dtype = "bfloat16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "float16"
        ptdtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
        ctx = nullcontext() if not torch.cuda.is_available() else torch.amp.autocast("cuda", dtype=ptdtype)
        model = torch.nn.Linear(2, 1)
        optimizer = torch.optim.AdamW(model.parameters())
        scaler = torch.cuda.amp.GradScaler(enabled=(dtype == "float16"))
        for it in range(3):
            with ctx:
                loss = model(torch.ones(4, 2)).sum()
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(optimizer)
            scaler.update()
    """)
    code = result.code
    assert "accelerator = Accelerator()\n" in code and "mixed_precision" not in code
    assert "accelerator.backward(scaler.scale(loss))" in code
    assert "scaler.step(optimizer)" in code and "scaler.update()" in code
    assert "model, optimizer = accelerator.prepare(model, optimizer)" in code


def test_a_full_batch_graph_with_a_fixed_train_mask_is_left_whole() -> None:
    # GCN/GAT: the whole graph every step, the loss on `labels[idx_train]` inside a helper: no sharding (sharding
    # the labels alone would pair them with the wrong nodes) and no false refusal for "bounds"
    result = convert("""
        import torch
        def train_step(model, optimizer, inputs, target, mask):
            optimizer.zero_grad()
            output = model(*inputs)
            loss = torch.nn.functional.cross_entropy(output[mask], target[mask])
            loss.backward()
            optimizer.step()
        if __name__ == "__main__":
            features, adj = torch.randn(10, 4), torch.eye(10)
            labels = torch.randint(0, 3, (10,))
            idx_train = torch.arange(6)
            model = Net()
            optimizer = torch.optim.Adam(model.parameters())
            for epoch in range(5):
                train_step(model, optimizer, (features, adj), labels, idx_train)
    """)
    assert "shard" not in result.code and not result.report.problems
    assert any("full batch" in f.action for f in result.report.found)


def test_a_script_whose_training_runs_in_an_imported_trainer_is_refused() -> None:
    # minGPT's projects: the model, data and `Trainer(config, model, data).run()` from the project's package; this
    # file has no backward and no optimizer, so preparing only its evaluation loader would not be data-parallel
    result = convert("""
        import torch
        from mingpt.model import GPT
        from mingpt.trainer import Trainer
        model = GPT(config)
        loader = torch.utils.data.DataLoader(torch.ones(8, 2), batch_size=2)
        trainer = Trainer(config, model, dataset)
        trainer.run()
        for x in loader:
            model.generate(x)
    """)
    assert [p.line for p in result.report.problems] == [6]
    assert "training happens in imported code (`Trainer`, mingpt.trainer.Trainer)" in result.report.problems[0].what


OPTIONAL_OPTIMIZER = """
    import argparse
    import torch
    parser = argparse.ArgumentParser()
    parser.add_argument("--use-optimizer", action="store_true")
    args = parser.parse_args()
    {model}
    if args.use_optimizer:
        optimizer = torch.optim.AdamW(model.parameters())
    for x in torch.ones(4, 3, 2):
        model(x).sum().backward()
        if args.use_optimizer:
            optimizer.step()
        else:
            for p in model.parameters():
                p.data.add_(p.grad, alpha=-0.1)
"""


def test_an_optimizer_created_under_a_flag_is_prepared_inside_the_if_and_its_model_before_it() -> None:
    # word_language_model: `if args.use_optimizer: optimizer = AdamW(...)`, else a hand-written SGD update: the
    # model trains on both paths, so it is prepared on its own before the `if`, the optimizer inside it (one
    # prepare after the `if` raised NameError without the flag)
    result = convert(OPTIONAL_OPTIMIZER.format(model="model = torch.nn.Linear(2, 1)"))
    code = result.code
    assert "model = torch.nn.Linear(2, 1)\nmodel = accelerator.prepare(model)\nif args.use_optimizer:\n" in code
    assert ("    optimizer = torch.optim.AdamW(model.parameters())\n"
            "    optimizer = accelerator.prepare(optimizer)\n") in code
    assert not any("only created when" in p.what for p in result.report.problems)
    assert any(f.kind == "optimizer" and "optional" in f.action for f in result.report.found)


def test_a_model_chosen_in_branches_counts_as_made_on_every_path() -> None:
    # `if args.model == "Transformer": model = ... else: model = ...` before the optional optimizer
    chooser = ('if args.use_optimizer and args.use_optimizer:\n        model = torch.nn.Linear(2, 1)\n'
               '    else:\n        model = torch.nn.Linear(2, 1)')
    result = convert(OPTIONAL_OPTIMIZER.format(model=chooser))
    assert "    model = torch.nn.Linear(2, 1)\nmodel = accelerator.prepare(model)\nif args.use_optimizer:\n" \
        in result.code
    assert "    optimizer = accelerator.prepare(optimizer)\n" in result.code


def test_an_optional_optimizer_of_a_model_made_on_one_path_only_is_still_refused() -> None:
    # the model itself exists only when a flag holds: the other path has nothing to prepare before the `if`
    result = convert(OPTIONAL_OPTIMIZER.format(model="if args.use_optimizer:\n        model = torch.nn.Linear(2, 1)"))
    assert any("`optimizer` is only created when `args.use_optimizer` holds" in p.what
               for p in result.report.problems)


COLUMN_STREAMS = """
    import torch
    def batchify(data, bsz):
        nbatch = data.size(0) // bsz
        return data.narrow(0, 0, nbatch * bsz).view(bsz, -1).t().contiguous()
    train_data = batchify(torch.randint(0, 10, (400,)), 4)
    val_data = batchify(torch.randint(0, 10, (90,)), 3)
    model = torch.nn.RNN(1, 8)
    def get_batch(source, i):
        seq_len = min(5, len(source) - 1 - i)
        return source[i:i + seq_len], source[i + 1:i + 1 + seq_len]
    def evaluate(data_source):
        with torch.no_grad():
            return sum(model(get_batch(data_source, i)[0].float().unsqueeze(-1))[0].sum().item()
                       for i in range(0, data_source.size(0) - 1, 5))
    best = None
    for epoch in range(2):
        for i in range(0, train_data.size(0) - 1, 5):
            data, targets = get_batch(train_data, i)
            model.zero_grad()
            model(data.float().unsqueeze(-1))[0].sum().backward()
            for p in model.parameters():
                p.data.add_(p.grad, alpha=-0.1)
        val = evaluate(val_data)
        if best is None or val < best:
            torch.save(model, "best.pt")
            best = val
    model = torch.load("best.pt", weights_only=False)
    print(evaluate(val_data))
"""


def test_column_streams_are_cut_in_time_and_the_best_model_loaded_back_after_a_barrier() -> None:
    # word_language_model: (length, batch) columns, rows `i:i + n` and the targets one row down: each process
    # takes a contiguous block of rows (every column stays, so states sized by the batch do too); the model
    # loaded back after training is not the one prepared; the file is read after every process got there
    result = convert(COLUMN_STREAMS)
    code = result.code
    assert "train_data = train_data[shard]\n" in code
    assert "val_data = val_data[" not in code  # every process evaluates all of it: the same `if` on every rank
    assert code.index("model = accelerator.prepare(model)") < code.index("for epoch in range(2):")
    assert code.count("accelerator.prepare(") == 1
    reload = code.index('model = torch.load("best.pt"')
    assert code.rindex("accelerator.wait_for_everyone()", 0, reload) > code.index("best = val")
    assert not result.report.problems
    assert find_concerns(code) == []


ROW_STREAMS = """
    import torch
    ids = torch.randint(0, 10, (400,))[:400].view(4, -1)
    model = torch.nn.LSTM(1, 8, batch_first=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    states = (torch.zeros(1, 4, 8), torch.zeros(1, 4, 8))
    for i in {loop}:
        {cut}
        out, states = model(inputs.float().unsqueeze(-1), [s.detach() for s in states])
        (out.sum() + targets.sum()).backward()
        opt.step()
"""
ROW_CUT = "inputs, targets = ids[:, i:i + 5], ids[:, (i + 1):(i + 1) + 5]"


def test_row_streams_are_cut_in_time_along_the_second_dimension() -> None:
    # yunjey's language model: `ids.view(batch_size, -1)` (each row a stream), `ids[:, i:i + n]` and the targets
    # `ids[:, i + 1:...]`, bounded by `ids.size(1)`: each process takes its own part of every row
    result = convert(ROW_STREAMS.format(loop="range(0, ids.size(1) - 5, 5)", cut=ROW_CUT))
    code = result.code
    assert "slice(accelerator.process_index * (ids.shape[1] // accelerator.num_processes)," in code
    assert "ids = ids[:, shard]\n" in code
    assert code.index("ids = ids[:, shard]") < code.index("for i in range(")
    assert not result.report.problems
    assert any(f.kind == "batches" and "parallel streams along dimension 1" in f.action
               for f in result.report.found)


def test_row_streams_cut_in_a_helper_of_the_script_are_cut_in_time() -> None:
    # (the helper's cuts were not looked at: the rows were sharded, halving the batch the states are sized for)
    helper = "    def get_batch(source, i):\n        return source[:, i:i + 5], source[:, i + 1:i + 6]\n"
    source = ROW_STREAMS.format(loop="range(0, ids.size(1) - 5, 5)", cut="inputs, targets = get_batch(ids, i)")
    result = convert(source.replace("    import torch\n", "    import torch\n" + helper, 1))
    assert "ids = ids[:, shard]\n" in result.code
    assert "ids = ids[shard]" not in result.code
    assert not result.report.problems


def test_row_streams_whose_loop_does_not_follow_the_windowed_dimension_are_refused() -> None:
    # `range(0, len(ids) - 5, 5)` counts rows while the windows run along the columns: not provably the stream
    result = convert(ROW_STREAMS.format(loop="range(0, len(ids) - 5, 5)", cut=ROW_CUT))
    assert any("its loop bounds do not follow the length of dimension 1" in p.what and p.line == 6
               for p in result.report.problems), result.report.problems
    assert "shard" not in result.code


def test_inputs_and_labels_cut_along_the_second_dimension_at_one_start_are_refused() -> None:
    # `x[:, i:i + n]` and `y[:, i:i + n]`: two names, one start each: no next-token targets, so dimension 1 may hold
    # the samples (a column-major layout), not time
    cut = "inputs, targets = ids[:, i:i + 5], labels[:, i:i + 5]"
    source = ROW_STREAMS.format(loop="range(0, ids.size(1) - 5, 5)", cut=cut)
    result = convert(source.replace("    model = ", "    labels = torch.randn(4, 100)\n    model = ", 1))
    assert any("takes one window per step along dimension 1" in p.what for p in result.report.problems), \
        result.report.problems
    assert "shard" not in result.code


def test_row_streams_cut_otherwise_as_well_are_refused() -> None:
    # a row of the data taken as well (`ids[0]`): what the dimensions hold is not known
    cut = ROW_CUT + "\n        inputs = inputs + ids[0][:5]"
    result = convert(ROW_STREAMS.format(loop="range(0, ids.size(1) - 5, 5)", cut=cut))
    assert any("also cuts it otherwise (`ids[0]`)" in p.what for p in result.report.problems), \
        result.report.problems
    assert "shard" not in result.code


TRAINS_ELSEWHERE = """
    import torch
    from mylib.trainer import Trainer
    model = torch.nn.Linear(2, 2)
    trained = Trainer(model, torch.ones(8, 2)).fit(2)
    print("DONE")
"""
UNCONVERTED_TRAINER = """
import torch


class Trainer:
    def __init__(self, model, data):
        self.model, self.data = model, data
        self.optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def fit(self, epochs):
        for _ in range(epochs):
            loss = self.model(self.data).sum()
            loss.backward()
            self.optimizer.step()
        return self.model
"""


def _project(tmp_path, trainer_code: str):
    (tmp_path / "mylib").mkdir()
    (tmp_path / "mylib" / "__init__.py").write_text("")
    (tmp_path / "mylib" / "trainer.py").write_text(trainer_code)
    return convert_source(textwrap.dedent(TRAINS_ELSEWHERE).lstrip(), filename="train.py", directory=tmp_path)


def test_a_script_whose_imported_trainer_is_converted_already_is_converted(tmp_path) -> None:
    # the to-do of the refusal done: the project's trainer module converted first (in place), then this script
    trainer = convert_source(UNCONVERTED_TRAINER, filename="trainer.py")
    assert "accelerator.prepare(" in trainer.code
    result = _project(tmp_path, trainer.code)
    assert not result.report.problems, [p.what for p in result.report.problems]
    assert "accelerator.print(\"DONE\")" in result.code and "prepare(" not in result.code
    assert any("handed to imported code in trainer.py, which is converted already" in f.action
               for f in result.report.found)


def test_a_script_whose_imported_trainer_is_not_converted_is_still_refused(tmp_path) -> None:
    # the same project before its trainer module is converted, and the same script with no folder to look in
    for result in (_project(tmp_path, UNCONVERTED_TRAINER),
                   convert_source(textwrap.dedent(TRAINS_ELSEWHERE).lstrip(), filename="train.py")):
        assert [p.line for p in result.report.problems] == [3, 4], [p.what for p in result.report.problems]
        assert "model `model` is only handed to imported code" in result.report.problems[0].what
        assert "training happens in imported code (`Trainer`, mylib.trainer.Trainer)" in \
            result.report.problems[1].what


def _package_above(root, trainer_code: str):
    """minGPT's layout: the package at the project's root, the script in projects/<name>/ importing it."""
    (root / "mylib").mkdir(parents=True)
    (root / "mylib" / "__init__.py").write_text("")
    (root / "mylib" / "trainer.py").write_text(trainer_code)
    script_dir = root / "projects" / "demo"
    script_dir.mkdir(parents=True)
    return script_dir


def test_a_converted_trainer_of_the_project_above_the_script_is_found(tmp_path, monkeypatch) -> None:
    # minGPT: projects/chargpt/chargpt.py imports mingpt.trainer from the repository's root (`pip install -e .`);
    # found through the project's setup.py above the script, once converted
    monkeypatch.delenv("PYTHONPATH", raising=False)
    converted = convert_source(UNCONVERTED_TRAINER, filename="trainer.py").code
    script_dir = _package_above(tmp_path, converted)
    source = textwrap.dedent(TRAINS_ELSEWHERE).lstrip()
    refused = convert_source(source, filename="train.py", directory=script_dir)
    assert refused.report.problems  # no project root marker yet: the package is not where the run looks
    (tmp_path / "setup.py").write_text("from setuptools import setup\nsetup(name='mylib')\n")
    result = convert_source(source, filename="train.py", directory=script_dir)
    assert not result.report.problems, [p.what for p in result.report.problems]
    (tmp_path / "mylib" / "trainer.py").write_text(UNCONVERTED_TRAINER)  # before its conversion: still refused
    again = convert_source(source, filename="train.py", directory=script_dir)
    assert "training happens in imported code (`Trainer`, mylib.trainer.Trainer)" in again.report.problems[1].what


def test_a_converted_trainer_on_pythonpath_is_found(tmp_path, monkeypatch) -> None:
    converted = convert_source(UNCONVERTED_TRAINER, filename="trainer.py").code
    script_dir = _package_above(tmp_path / "libs", converted)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "libs"))
    result = convert_source(textwrap.dedent(TRAINS_ELSEWHERE).lstrip(), filename="train.py", directory=script_dir)
    assert not result.report.problems, [p.what for p in result.report.problems]


SUMMED_EVAL = """
    import torch
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, TensorDataset
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    train_loader = DataLoader(TensorDataset(torch.rand(16, 4)), batch_size=4)
    test_loader = DataLoader(TensorDataset(torch.rand(10, 4), torch.zeros(10)), batch_size=4)
    def loss_function(recon, x):
        return F.mse_loss(recon, x, reduction=REDUCTION)
    for (x,) in train_loader:
        loss = loss_function(model(x), x)
        loss.backward()
        optimizer.step()
    test_loss = 0
    with torch.no_grad():
        for i, (data, _) in enumerate(test_loader):
            test_loss += loss_function(model(data), data).item()
    print(test_loss / len(test_loader.dataset))
"""


def test_a_summed_evaluation_loss_cuts_the_padded_samples_of_the_last_batch() -> None:
    # pytorch/examples' VAE: `test_loss += loss_function(...).item()` (a sum inside the script's own function), no
    # labels to gather: the reduce after the loop counted the samples Accelerate repeats to even out the last round
    result = convert(SUMMED_EVAL.replace("REDUCTION", "'sum'"))
    lines = [line.strip() for line in result.code.splitlines()]
    start = lines.index("for i, (data, _) in enumerate(test_loader):")
    assert lines[start + 2:start + 8] == [
        "keep = len(data)",
        "if accelerator.gradient_state.end_of_dataloader and accelerator.gradient_state.remainder > 0:",
        "keep = min(max(accelerator.gradient_state.remainder - accelerator.process_index * len(data), 0), "
        "len(data))",
        "data, _ = data[:max(keep, 1)], _[:max(keep, 1)]",
        "if keep > 0:",
        "test_loss += loss_function(model(data), data).item()"], result.code
    assert 'test_loss = accelerator.reduce(torch.as_tensor(test_loss, device=accelerator.device), "sum").item()' \
        in result.code
    assert any("each sample counted once" in f.action for f in result.report.found)
    assert not result.report.problems


def test_a_sum_of_batch_means_is_cut_and_skips_empty_batches() -> None:
    # pytorch/examples' siamese network: `test_loss += criterion(outputs, targets).item()` sums batch *means*;
    # the repeated samples of the last round were counted (4 terms where one process has 3); cut to the real
    # share, an empty batch (mean nan) adds nothing, so the terms are the one-process run's batches
    result = convert(SUMMED_EVAL.replace("REDUCTION", "'mean'"))
    lines = [line.strip() for line in result.code.splitlines()]
    start = lines.index("for i, (data, _) in enumerate(test_loader):")
    assert lines[start + 5:start + 9] == [
        "data, _ = data[:max(keep, 1)], _[:max(keep, 1)]",
        "if keep > 0:",
        "test_loss += loss_function(model(data), data).item()",
        'test_loss = accelerator.reduce(torch.as_tensor(test_loss, device=accelerator.device), "sum").item()'], \
        result.code
    assert any("each sample counted once" in f.action for f in result.report.found)
    assert not result.report.problems


def test_a_sum_of_batch_means_sharing_its_line_is_left_and_reported() -> None:
    source = SUMMED_EVAL.replace("REDUCTION", "'mean'").replace(
        "test_loss += loss_function(model(data), data).item()",
        "test_loss += loss_function(model(data), data).item(); seen = 1")
    result = convert(source)
    assert "remainder" not in result.code
    assert any("padded by Accelerate for an uneven split is counted too" in f.action for f in result.report.found)


def test_a_loader_made_with_the_process_rank_is_not_sharded_again_and_the_inner_model_is_not_prepared() -> None:
    # build-nanogpt: `DataLoaderLite(..., process_rank=ddp_rank, num_processes=ddp_world_size)` reads each rank's
    # own part already; `raw_model = model.module if ddp else model` is the same parameters as `model`
    source = (DATA / "convert" / "real_world" / "rank_sharded_loader.py").read_text()
    result = convert_source(source, filename="rank_sharded_loader.py")
    assert "shard" not in result.code.replace("sharded", "")
    assert result.code.count("accelerator.prepare(") == 1
    assert "model, optimizer = accelerator.prepare(model, optimizer)\n" in result.code
    assert "raw_model = accelerator.unwrap_model(model) if ddp else model\n" in result.code
    assert "process_rank=ddp_rank" in result.code and "ddp_rank = accelerator.process_index" in result.code
    assert any("sharded by the script itself" in f.action for f in result.report.found)
    assert not result.report.problems
    assert not find_concerns(result.code)


def test_an_evaluation_every_n_steps_reports_its_cadence_for_the_check() -> None:
    # makemore: `if step > 0 and step % 500 == 0: evaluate(...)` inside the training loop; the check's step hint
    # was the length of its 10**10-sample "epoch"
    source = (DATA / "convert" / "real_world" / "eval_every.py").read_text()
    report = convert_source(source, filename="eval_every.py").report
    assert report.evaluation_loops == [13] and report.evaluation_every == [3]
    epochs = source.replace("    if step > 0 and step % 3 == 0:\n        print(", "    if step > 0:\n        print(")
    assert convert_source(epochs, filename="eval_every.py").report.evaluation_every == []


def test_a_progress_bar_from_the_scripts_own_module_is_drawn_by_the_local_main_process_only() -> None:
    # kuangliu/pytorch-cifar: `progress_bar(...)` from its `utils.py` (not converted) writes sys.stdout on every
    # process; --check's `side effects` failed on the other rank's bar lines
    folder = DATA / "convert" / "real_world"
    result = convert_source((folder / "progress_helper.py").read_text(), filename="progress_helper.py",
                            directory=folder)
    assert result.code.count("if accelerator.is_local_main_process:\n") == 2
    assert "        if accelerator.is_local_main_process:\n            draw_bar(batch_idx, len(trainloader)" \
        in result.code
    gated = [c for c in result.report.changes if c.what.startswith("`draw_bar(...)` now runs on the local main")]
    assert [c.line for c in gated] == [35, 47]
    assert "terminal_bar.py" in gated[0].why
    assert not result.report.problems
    assert not find_concerns(result.code)


HELPER_SCRIPT = """
import torch
from helpers_mod import show
model = torch.nn.Linear(2, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    loss = model(torch.randn(4, 2)).sum()
    loss.backward()
    optimizer.step()
    show(step, ARG)
"""


def _gated(tmp_path, helper: str, arg: str = "loss.item()", gate: str = "is_local_main_process") -> bool:
    (tmp_path / "helpers_mod.py").write_text(textwrap.dedent(helper).lstrip())
    code = convert_source(HELPER_SCRIPT.replace("ARG", arg), filename="train.py", directory=tmp_path).code
    return f"if accelerator.{gate}:\n        show(" in code


def test_only_a_helper_that_does_nothing_but_print_is_moved_to_the_main_process(tmp_path) -> None:
    printing = """
        import sys
        import time
        last = time.time()
        def show(step, value):
            global last
            now = time.time()
            parts = ["step %d" % step, " %.3f" % value]
            parts.append(" (%.1fs)" % (now - last))
            last = now
            sys.stdout.write("".join(parts) + "\\n")
    """
    assert _gated(tmp_path, printing)
    # a file written beside the print, a value returned, a tensor touched, a raise: it does more than print
    assert not _gated(tmp_path, "def show(step, value):\n    print(step)\n    open('log.txt', 'a').write('x')\n")
    assert not _gated(tmp_path, "def show(step, value):\n    print(step)\n    return value * 2\n")
    assert not _gated(tmp_path, "def show(step, value, log=None):\n    print(step, file=log)\n")
    assert _gated(tmp_path, "import sys\ndef show(step, value):\n    print(step, file=sys.stderr, flush=True)\n")
    assert not _gated(tmp_path, "def show(step, value):\n    print(step)\n    value.mul_(2)\n")
    assert not _gated(tmp_path, "def show(step, value):\n    if step > 5:\n        raise ValueError(step)\n"
                                "    print(step)\n")
    assert not _gated(tmp_path, "def show(step, values):\n    values.append(step)\n    print(step)\n")
    assert not _gated(tmp_path, "def show(step, value, **kw):\n    print(step, **kw)\n")
    # a container it did not make (a function's result may be shared state): filling it is not only printing
    assert not _gated(tmp_path, "SEEN = []\ndef state():\n    return SEEN\ndef show(step, value):\n"
                                "    seen = state()\n    seen.append(step)\n    print(step)\n")
    # its timing state is read by another function or a class of the module: it must keep ticking on every process
    assert not _gated(tmp_path, printing + "\ndef since():\n    return time.time() - last\n")
    assert not _gated(tmp_path, printing + "\nclass Timer:\n    def since(self):\n        return time.time() - last\n")
    # printing nothing at all, or an argument that advances an iterator or runs a collective: left alone
    assert not _gated(tmp_path, "def show(step, value):\n    x = step + 1\n")
    assert not _gated(tmp_path, printing, arg="next(it)")
    assert not _gated(tmp_path, printing, arg="accelerator.reduce(loss)")


def _files_gated(tmp_path, helper: str) -> bool:
    return _gated(tmp_path, helper, gate="is_main_process")


def test_a_helper_that_only_writes_bookkeeping_files_runs_on_the_main_process(tmp_path) -> None:
    # minGPT's `setup_logging(config)` (mingpt/utils.py): a folder, `args.txt` and `config.json` written by every
    # process at once; its config is turned into a dict by a method of the module's own class
    bookkeeping = """
        import os
        import sys
        import json
        class Config:
            def __init__(self, **kwargs):
                self.__dict__.update(kwargs)
            def to_dict(self):
                return {k: v.to_dict() if isinstance(v, Config) else v for k, v in self.__dict__.items()}
        def show(step, config):
            work_dir = "out"
            os.makedirs(work_dir, exist_ok=True)
            with open(os.path.join(work_dir, "args.txt"), "w") as f:
                f.write(" ".join(sys.argv))
            with open(os.path.join(work_dir, "config.json"), "w") as f:
                f.write(json.dumps(config.to_dict(), indent=4))
            with open(os.path.join(work_dir, "steps.json"), "a") as log:
                json.dump({"step": step}, log)
                print("saved", step, file=log)
    """
    assert _files_gated(tmp_path, bookkeeping)
    result = convert_source(HELPER_SCRIPT.replace("ARG", "loss.item()"), filename="train.py", directory=tmp_path)
    gated = [c for c in result.report.changes if c.what == "`show(...)` now runs on the main process only"]
    assert len(gated) == 1 and "only writes files and folders (read in helpers_mod.py" in gated[0].why
    # a file read, a lock, a file opened for update, a handle the caller gave, a method that changes its object:
    # it does more than write its own output
    assert not _files_gated(tmp_path, "def show(step, value):\n    with open('log.txt') as f:\n"
                                      "        print(f.read())\n")
    assert not _files_gated(tmp_path, "import threading\nLOCK = threading.Lock()\ndef show(step, value):\n"
                                      "    with LOCK:\n        print(step)\n")
    assert not _files_gated(tmp_path, "def show(step, value):\n    with open('log.txt', 'r+') as f:\n"
                                      "        f.write(str(step))\n")
    assert not _files_gated(tmp_path, "import json\ndef show(step, value, log=None):\n    json.dump(step, log)\n")
    assert not _files_gated(tmp_path, "class Box:\n    def bump(self):\n        self.n = 1\n"
                                      "def show(step, value):\n    value.bump()\n    print(step)\n")
    assert not _files_gated(tmp_path, "import os\ndef show(step, value):\n    os.remove('log.txt')\n")


def test_a_bookkeeping_helper_of_the_project_above_the_script_is_found(tmp_path, monkeypatch) -> None:
    # minGPT's layout: projects/chargpt/chargpt.py imports mingpt.utils from the repository's root (setup.py)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    (tmp_path / "setup.py").write_text("from setuptools import setup\nsetup(name='tools')\n")
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "__init__.py").write_text("")
    (tmp_path / "tools" / "logs.py").write_text("import os\ndef show(step, value):\n    os.makedirs('out', "
                                                "exist_ok=True)\n    with open('out/args.txt', 'w') as f:\n"
                                                "        f.write(str(step))\n")
    script_dir = tmp_path / "projects" / "demo"
    script_dir.mkdir(parents=True)
    script = HELPER_SCRIPT.replace("from helpers_mod import show", "from tools.logs import show")
    code = convert_source(script.replace("ARG", "loss.item()"), filename="train.py", directory=script_dir).code
    assert "if accelerator.is_main_process:\n        show(step, loss.item())" in code


def test_a_printing_helper_in_a_package_of_the_project_is_found_by_its_module_path(tmp_path) -> None:
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "__init__.py").write_text("")
    (tmp_path / "tools" / "console.py").write_text("import sys\ndef show(step, value):\n"
                                                   "    sys.stdout.write('%d %.3f\\r' % (step, value))\n")
    script = HELPER_SCRIPT.replace("from helpers_mod import show", "from tools.console import show")
    code = convert_source(script.replace("ARG", "loss.item()"), filename="train.py", directory=tmp_path).code
    assert "if accelerator.is_local_main_process:\n        show(step, loss.item())" in code
    # the same name from a module that is not the project's own (no tools/other.py): left alone
    other = convert_source(script.replace("tools.console", "tools.other").replace("ARG", "loss.item()"),
                           filename="train.py", directory=tmp_path).code
    assert "is_local_main_process" not in other


def test_a_printing_helper_called_at_import_time_stays_as_it_is_when_the_accelerator_is_made_in_main(tmp_path) -> None:
    # like a module-level print: `accelerator` does not exist yet when the module is imported (a NameError)
    (tmp_path / "ui.py").write_text("import sys\ndef banner(t):\n    sys.stdout.write('== %s ==\\n' % t)\n")
    script = textwrap.dedent("""
        import argparse
        import torch
        from ui import banner
        banner("start")
        def main():
            parser = argparse.ArgumentParser()
            args = parser.parse_args()
            model = torch.nn.Linear(2, 1)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for step in range(3):
                loss = model(torch.randn(4, 2)).sum()
                loss.backward()
                optimizer.step()
                banner("step %d" % step)
        if __name__ == "__main__":
            main()
    """).lstrip()
    result = convert_source(script, filename="train.py", directory=tmp_path)
    assert "\nbanner(\"start\")\n" in result.code and "    accelerator = Accelerator()" in result.code
    assert "if accelerator.is_local_main_process:\n            banner(\"step %d\" % step)" in result.code
    assert [c.line for c in result.report.changes if c.what.startswith("`banner(...)`")] == [14]
    assert not find_concerns(result.code)


def test_a_trainer_class_holding_the_loader_and_saving_under_a_rank_test_converts_without_a_hang() -> None:
    # the DDP tutorials' multigpu_torchrun.py: `Trainer(model, loader, ...)` keeps the loader as self.train_data,
    # calls `self.train_data.sampler.set_epoch(epoch)`, and saves in `_save_snapshot`, called only under
    # `if self.local_rank == 0 and ...:`. Were: a false refusal (the loop's batches "from no DataLoader"), the
    # set_epoch kept (AttributeError on 2 ranks), and barriers inside `_save_snapshot` (rank 1 never reaches them:
    # a hang)
    source = (DATA / "convert" / "real_world" / "torchrun_trainer.py").read_text()
    result = convert_source(source, filename="torchrun_trainer.py")
    assert not result.report.problems, [p.format() for p in result.report.problems]
    assert "set_epoch" not in result.code
    assert "wait_for_everyone" not in result.code
    assert "accelerator.save(" in result.code
    assert "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)" in result.code
    assert any("`_save_snapshot` is called under `if self.local_rank == 0" in c.what for c in result.report.changes)
    # the tutorial's own names: `self.gpu_id = int(os.environ["LOCAL_RANK"])`, `if self.gpu_id == 0 and ...:` (no
    # "rank" in the test: the name is bound to the rank)
    gpu_id = source.replace("self.local_rank", "self.gpu_id")
    assert "wait_for_everyone" not in convert_source(gpu_id, filename="torchrun_trainer.py").code
    inline = gpu_id.replace("                self._save_snapshot(epoch)", "                torch.save(epoch, 'e.pt')")
    code = convert_source(inline, filename="torchrun_trainer.py").code
    assert ("            if self.gpu_id == 0 and epoch % self.save_every == 0:\n"
            "                accelerator.save(epoch, 'e.pt')\n") in code
    # the same save called outside any branch keeps its barriers
    plain = source.replace("if self.local_rank == 0 and epoch % self.save_every == 0:", "if True:")
    assert convert_source(plain, filename="torchrun_trainer.py").code.count("accelerator.wait_for_everyone()") == 2


def test_a_full_batch_lbfgs_closure_is_left_whole() -> None:
    # pytorch/examples' time_sequence_prediction: `optimizer.step(closure)` re-evaluates the closure over the whole
    # training tensor; was: no training loop found (the backward is in the closure, handed to step, never called
    # by name), nothing reported, and `--check` failed `samples` ("every rank trained on the same inputs")
    source = (DATA / "convert" / "real_world" / "lbfgs_full_batch.py").read_text()
    result = convert_source(source, filename="lbfgs_full_batch.py")
    assert not result.report.problems, [p.format() for p in result.report.problems]
    assert "shard" not in result.code and "net, optimizer = accelerator.prepare(net, optimizer)" in result.code
    full = [f for f in result.report.found if f.kind == "batches"]
    assert len(full) == 1 and full[0].action.startswith("full batch") and full[0].name == "input, target"
    assert "`optimizer.step(closure)`" in full[0].action


def test_an_archive_unpacked_on_every_run_is_unpacked_by_the_main_process_alone() -> None:
    # pytorch/examples' gcn: `with requests.get(url) as f: tarfile.open(fileobj=f.raw).extractall()` on every run;
    # was: under main_process_first only, so the others unpacked it again over the files the main process was
    # already reading (a crash on 2 ranks: "too many indices for array")
    result = convert("""
        import tarfile
        import requests
        import torch
        def main():
            with requests.get("https://example.org/cora.tgz", stream=True) as tgz_file:
                with tarfile.open(fileobj=tgz_file.raw, mode="r:gz") as tgz:
                    tgz.extractall()
            model = torch.nn.Linear(2, 1)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            x = torch.load("cora/x.pt")
            for _ in range(3):
                loss = model(x).sum()
                loss.backward()
                opt.step()
        main()
    """)
    assert ("    with accelerator.main_process_first():\n        if accelerator.is_local_main_process:\n"
            "            with requests.get(") in result.code
    # decided by `if not os.path.exists(...)`, or binding a name used afterwards: every process runs it, after the
    # main process (the others find the files, or need the name)
    guarded = convert("""
        import os, tarfile
        import torch
        def main():
            if not os.path.exists("data"):
                with tarfile.open("data.tgz") as tgz:
                    tgz.extractall()
            model = torch.nn.Linear(2, 1)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for _ in range(3):
                loss = model(torch.ones(4, 2)).sum()
                loss.backward()
                opt.step()
        main()
    """)
    assert "main_process_first" in guarded.code and "is_local_main_process" not in guarded.code


BEST_SAVED_IN = """
    import os
    import torch
    def fit(model, opt, path):
        best = None
        for step in range(4):
            loss = model(torch.randn(8, 2)).pow(2).mean()
            loss.backward()
            opt.step()
            if best is None or loss.item() < best:
                best = loss.item()
                torch.save(model.state_dict(), path)
        model.load_state_dict(torch.load(path))
    def main():
        model = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        {call}
    main()
"""


def test_a_best_checkpoint_read_back_in_the_same_function_waits_for_the_main_process() -> None:
    # the save runs under a per-process `if` (no barrier there: a hang), the read after the loop on every process
    code = convert(BEST_SAVED_IN.format(call='fit(model, opt, "best.pt")')).code
    barrier = code.index("    accelerator.wait_for_everyone()\n    accelerator.unwrap_model(model).load_state_dict(")
    assert barrier > code.index("accelerator.save(")
    assert code.count("wait_for_everyone") == 1


def test_no_barrier_before_the_read_back_when_only_some_processes_run_the_function() -> None:
    # `fit` called under a rank test: a barrier in it would wait forever for the processes that skip it
    code = convert(BEST_SAVED_IN.format(call='if int(os.environ.get("RANK", 0)) == 0:\n            fit(model, opt, '
                                             '"best.pt")')).code
    assert "wait_for_everyone" not in code


GYM_REINFORCE = """
import gymnasium as gym
import torch
import torch.nn as nn
from torch.distributions import Categorical

env = gym.make('CartPole-v1')
env.reset(seed=SEED)
torch.manual_seed(SEED)
policy = nn.Sequential(nn.Linear(4, 2), nn.Softmax(dim=1))
optimizer = torch.optim.Adam(policy.parameters(), lr=1e-2)


def finish_episode(log_probs, rewards):
    returns = []
    R = 0
    for r in rewards[::-1]:
        R = r + 0.99 * R
        returns.insert(0, R)
    returns = torch.tensor(returns)
    loss = torch.cat([-p * R for p, R in zip(log_probs, returns)]).sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def main():
    running = 10
    for episode in range(1000):
        state, _ = env.reset()
        log_probs, rewards = [], []
        for t in range(1, 500):
            m = Categorical(policy(torch.from_numpy(state).float().unsqueeze(0)))
            action = m.sample()
            log_probs.append(m.log_prob(action))
            state, reward, terminated, truncated, _ = env.step(action.item())
            rewards.append(reward)
            if terminated or truncated:
                break
        running = 0.05 * sum(rewards) + 0.95 * running
        finish_episode(log_probs, rewards)
        if running > env.spec.reward_threshold:
            break


if __name__ == '__main__':
    main()
"""


def test_episodes_of_a_gym_environment_are_played_per_process_and_the_solved_stop_is_taken_together() -> None:
    # pytorch/examples' reinforce.py was refused: `torch.tensor(returns)` of finish_episode's own list was taken for
    # hand-made batches "bound at module level"
    result = convert(GYM_REINFORCE.replace("SEED", "543"))
    assert not result.report.problems, result.report.problems
    code = result.code
    assert "policy, optimizer = accelerator.prepare(policy, optimizer)" in code
    assert "    if accelerator.process_index > 0:\n        torch.manual_seed(543 + accelerator.process_index)\n" \
           "        env.reset(seed=543 + accelerator.process_index)\n" in code, code
    # the episode ends on its own `terminated` on each process (a trigger there would be called a different number
    # of times per process: a hang); the stop on the running reward is collective
    assert "            if terminated or truncated:\n                break\n" in code, code
    assert code.count("accelerator.check_trigger()") == 1
    assert "        if running > env.spec.reward_threshold:\n            accelerator.set_trigger()\n" in code
    assert any(f.kind == "batches" and "episodes of the environment `env`" in f.action for f in result.report.found)
    assert not find_concerns(code)


def test_unseeded_episodes_still_draw_their_actions_apart() -> None:
    # torch starts every process from the same default seed: the sampled actions would be the same everywhere
    result = convert(GYM_REINFORCE.replace("env.reset(seed=SEED)\ntorch.manual_seed(SEED)\n", ""))
    assert "torch.manual_seed(torch.initial_seed() + accelerator.process_index)" in result.code, result.code
    assert "env.reset(seed=" not in result.code


INLINE_LOOP = """
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

dataset = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
model = nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
for epoch in range(2):
    for step, (x, y) in enumerate(DataLoader(dataset, batch_size=8, shuffle=True)):
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
"""


def test_a_dataloader_made_in_the_loop_header_is_prepared_where_it_is_made() -> None:
    # it was left unprepared and the conversion said nothing: every process trained on all of the data
    result = convert(INLINE_LOOP)
    assert "for step, (x, y) in enumerate(accelerator.prepare(DataLoader(dataset, batch_size=8, shuffle=True))):" \
        in result.code, result.code
    assert any(f.kind == "dataloader" and "made inline" in f.action for f in result.report.found)
    assert not result.report.problems


TRAINER_CLASS = """
class Trainer:
    def __init__(self, model, data, optimizer):
        self.model = model
        self.data = data
        self.optimizer = optimizer

    def train(self, epochs):
        for epoch in range(epochs):
            for x, y in self.data:
                self.optimizer.zero_grad()
                F.mse_loss(self.model(x), y).backward()
                self.optimizer.step()

"""


def test_a_dataloader_handed_inline_to_a_trainer_is_prepared_not_refused() -> None:
    # `Trainer(model, DataLoader(...), optimizer).train(2)`: "batches that do not come from a DataLoader" (false)
    source = INLINE_LOOP.split("for epoch")[0] + TRAINER_CLASS + """
Trainer(model, DataLoader(dataset, batch_size=8), optimizer).train(2)
"""
    result = convert(source)
    assert not result.report.problems, result.report.problems
    assert "Trainer(model, accelerator.prepare(DataLoader(dataset, batch_size=8)), optimizer).train(2)" in result.code
    assert "model, optimizer = accelerator.prepare(model, optimizer)" in result.code


def test_a_module_level_script_with_a_trainer_class_prepares_its_own_names_not_self() -> None:
    # the class's `self.model = model` was taken for the module's name of the model: `model, self.model, ... =
    # accelerator.prepare(model, self.model, ...)` at module level, a NameError on every process
    source = INLINE_LOOP.split("for epoch")[0] + TRAINER_CLASS + """
loader = DataLoader(dataset, batch_size=8)
Trainer(model, loader, optimizer).train(2)
"""
    result = convert(source)
    assert "self.model" not in result.code.split("class Trainer")[0] + result.code.split("loader = ")[-1]
    assert "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)" in result.code, result.code
    assert not find_concerns(result.code)


MODEL_LISTS = """
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

loader = DataLoader(TensorDataset(torch.randn(32, 4), torch.randn(32, 1)), batch_size=8)
NETS
for x, y in loader:
    for net, opt in zip(nets, optimizers):
        loss = nn.functional.mse_loss(net(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
"""


def test_models_compared_in_a_list_are_prepared_and_the_list_made_again() -> None:
    # MorvanZhou's 306_optimizer.py: the lists were built before the prepare and held the unprepared models (every
    # process trained its own copies, and the conversion said nothing); the inner zip loop also read as "batches
    # that do not come from a DataLoader" (it runs inside the loop over the loader)
    nets = ("net_a = nn.Linear(4, 1)\nnet_b = nn.Linear(4, 1)\nnets = [net_a, net_b]\n"
            "opt_a = torch.optim.SGD(net_a.parameters(), lr=0.1)\nopt_b = torch.optim.Adam(net_b.parameters())\n"
            "optimizers = [opt_a, opt_b]\n")
    result = convert(MODEL_LISTS.replace("NETS\n", nets))
    assert not result.report.problems, result.report.problems
    prepared = "net_a, net_b, opt_a, opt_b, loader = accelerator.prepare(net_a, net_b, opt_a, opt_b, loader)\n"
    assert prepared + "nets = [net_a, net_b]\noptimizers = [opt_a, opt_b]\n" in result.code, result.code


def test_models_made_inside_a_list_are_refused_with_the_line_but_layers_for_a_model_are_not() -> None:
    # MorvanZhou's 504_batch_normalization.py: `nets = [Net(), Net(bn=True)]` was "converted" with nothing prepared
    nets = ("nets = [nn.Linear(4, 1), nn.Linear(4, 1)]\n"
            "optimizers = [torch.optim.SGD(n.parameters(), lr=0.1) for n in nets]\n")
    result = convert(MODEL_LISTS.replace("NETS\n", nets))
    assert [p.line for p in result.report.problems] == [6, 7], result.report.problems
    assert "models made inside a container (`nets`, line 6)" in result.report.problems[0].what
    assert "optimizers made inside a container (`optimizers`, line 7)" in result.report.problems[1].what
    layers = ("layers = [nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1)]\nmodel = nn.Sequential(*layers)\n"
              "nets, optimizers = [model], [torch.optim.SGD(model.parameters(), lr=0.1)]\n")
    result = convert(MODEL_LISTS.replace("NETS\n", layers))
    assert not any("`layers`" in p.what for p in result.report.problems), result.report.problems


def test_a_model_only_built_and_printed_is_not_taken_for_one_trained_elsewhere() -> None:
    # MorvanZhou's 303_build_nn_quickly.py: "model `net1` is only handed to imported code, which trains it" for
    # `print(net1)`; a model handed to an imported Trainer is still refused
    source = "import torch\nnet = torch.nn.Sequential(torch.nn.Linear(1, 10), torch.nn.ReLU())\nprint(net)\n"
    result = convert(source)
    assert not result.report.problems, result.report.problems
    handed = convert("import torch\nfrom trainlib import Trainer\nnet = torch.nn.Linear(1, 1)\n"
                     "Trainer(net).run()\n")
    assert handed.report.problems and "imported" in handed.report.problems[0].what


def test_a_refusal_with_nothing_else_to_change_is_reported_not_nothing_to_convert(tmp_path) -> None:
    # a model handed to an imported Trainer, and nothing else in the file to edit: the refusal was dropped and the
    # command said "nothing to convert" (exit 0): every process would then train its own copy
    from accelkit.convert.entry import ConvertRequest, run_convert

    script = tmp_path / "handed.py"
    script.write_text("import torch\nfrom trainlib import Trainer\nnet = torch.nn.Linear(1, 1)\nTrainer(net).run()\n")
    result = run_convert(ConvertRequest(script=script))
    assert result.error is not None and "imported code" in str(result.error)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["handed.py"]


FULL_BATCH_WITH_TEST = (DATA / "convert" / "real_world" / "full_batch_heldout.py").read_text()


def test_full_batch_targets_in_the_next_statement_are_sharded_with_the_inputs_and_test_data_stays_whole() -> None:
    # MorvanZhou's 302_classification.py: `out = net(x)` then `loss = loss_func(out, y)`: x was sharded, y not (a
    # crash on 2 ranks: batch 100 against 200); 503_dropout.py: the test set under `if t % 10 == 0:` was sharded
    # too, so each process evaluated half of it
    result = convert(FULL_BATCH_WITH_TEST)
    assert "x, y = x[shard], y[shard]\n" in result.code, result.code
    assert "test_x[shard]" not in result.code and "test_y[shard]" not in result.code
    assert not result.report.problems
