"""Benchmark: merging sharded checkpoints with accelkit vs the peer tools, wall time and peak RSS side by side.

    python benchmarks/merge.py [--cache DIR] [--models linear-1gb,llama-217m] [--runs 3]

Two models, each saved once (cached under DIR) with the real tools on 2 CPU ranks: FSDP2 + torch DCP, and
DeepSpeed ZeRO-2 and ZeRO-3 after one AdamW step (so the ZeRO folders also hold Adam state):

- linear-1gb: 32 Linear layers of 2816x2816, about 1 GB of fp32 weights (the figures this benchmark always had);
- llama-217m: a 217M-parameter Llama (hidden 1024, 12 layers, vocabulary 32000, untied head): a transformer's mix of
  large embeddings, matrices and small norms.

Every tool runs in a fresh process, measured by a small wrapper (wall time, and the peak RSS and CPU time of its
child from getrusage(RUSAGE_CHILDREN)); runs of the tools alternate and the median of `--runs` is printed:

- DCP:      accelkit merge-ckpt  vs  `accelerate merge-weights`
- ZeRO-2/3: accelkit merge-ckpt  vs  DeepSpeed's zero_to_fp32.py (the script it writes into the checkpoint)
- copy:     `cp` of a file holding exactly the bytes the merge reads and writes (the merged output, copied):
            what the disk and page cache allow, the baseline issue 24 sets (a merge within 2x of it); and, for
            reference, `cp -r` of the checkpoint folder (a ZeRO folder also holds Adam state the merge never reads)
            and reading the files the merge opens (`cat FILES > /dev/null`);
- before:   with `--before DIR`, accelkit from another source tree (e.g. an export of main), run alternately with
            this tree's, so a change is measured under the same load.

`--vs-copy` runs only the comparison issue 45 sets (a merge within 1.5x of a copy): llama-217m's DCP checkpoint
against `cp -r` of it (the checkpoint is the 0.87 GB merged), and its ZeRO-2 checkpoint against `cp` of the bytes
merged (`cp -r` of a ZeRO folder also copies 2.6 GB of Adam state no merge reads), merge and copy alternating (and
the `--before` tree in turn), `--runs` of each; it prints the medians side by side, their ratio, the peak RSS and
the machine's load.

Both trees' bytecode is compiled first, as `pip install` does: the build machine sets PYTHONDONTWRITEBYTECODE=1, so
without it every run would compile accelkit's modules from source (0.07 s of a merge's 0.17 s of imports).

Then the cost of accelkit's integrity checks: the same merges with the CRC-32 and non-finite checks switched off
(a switch only this benchmark uses), the time the checks themselves took (accelkit reports it), and the verification
of a manifest (sha256 of every file, as for a checkpoint accelkit's templates save). Caches are warm: every tool
reads files just read by the one before. Nothing here is asserted. On a shared machine, read the medians together
with the load average printed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from accelkit.launch.build_locks import clear_stale_build_locks

HIDDEN = 2816  # a 2816x2816 fp32 Linear weight is 31.7 MB
MODELS = ("linear-1gb", "llama-217m")
NO_CHECKS = ("import sys, accelkit.merge.records as r; r.CHECK_CRC = False; r.SCAN_NONFINITE = False; "
             "from accelkit.cli import main; sys.argv[0] = 'accelkit'; main()")


def build_model(name: str):
    import torch

    torch.manual_seed(0)
    if name == "linear-1gb":
        layers = round(1e9 / (HIDDEN * HIDDEN * 4))
        return torch.nn.Sequential(*[torch.nn.Linear(HIDDEN, HIDDEN) for _ in range(layers)])
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2752, num_hidden_layers=12,
                         num_attention_heads=16, num_key_value_heads=16, tie_word_embeddings=False)
    return LlamaForCausalLM(config)


def _loss(model, name: str):
    import torch

    if name == "linear-1gb":
        return model(torch.randn(2, HIDDEN)).float().pow(2).mean()
    ids = torch.randint(0, 32000, (1, 16))
    return model(input_ids=ids, labels=ids).loss


def produce(model_name: str, kind: str, out: Path) -> None:
    """Runs inside each of 2 torchrun ranks."""
    import torch
    import torch.distributed as dist

    if kind == "dcp":
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_model_state_dict
        from torch.distributed.fsdp import fully_shard

        dist.init_process_group("gloo")
        model = build_model(model_name)
        units = list(model) if model_name == "linear-1gb" else list(model.model.layers)
        for unit in units:
            fully_shard(unit)
        fully_shard(model)
        dcp.save(get_model_state_dict(model), checkpoint_id=str(out))
        dist.destroy_process_group()
        return
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    model = build_model(model_name)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    config = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": int(kind[-1])},
              "zero_allow_untested_optimizer": True}
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    engine.backward(_loss(engine, model_name))
    engine.step()
    engine.save_checkpoint(str(out), tag="step1")


def ensure_checkpoints(cache: Path, model_name: str,
                       kinds: tuple[str, ...] = ("dcp", "zero2", "zero3")) -> dict[str, Path]:
    root = cache if model_name == "linear-1gb" else cache / model_name  # linear-1gb keeps its old cache path
    paths = {kind: root / kind for kind in kinds}
    for kind, path in paths.items():
        if (path / "BENCH_DONE").is_file():
            continue
        shutil.rmtree(path, ignore_errors=True)
        print(f"building the {model_name} {kind} checkpoint under {path} ...", file=sys.stderr)
        env = {**os.environ, "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu"}
        for line in clear_stale_build_locks(env):  # DeepSpeed without accelkit launch: a killed op build hangs it
            print(line, file=sys.stderr)
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                        __file__, "--produce", model_name, kind, str(path)], check=True, env=env,
                       stdout=subprocess.DEVNULL)
        (path / "BENCH_DONE").write_text("ok\n")
    return paths


def with_manifest(dcp_dir: Path, where: Path) -> Path:
    """A hard-linked copy of a DCP checkpoint with the manifest accelkit's templates write (their own code)."""
    if (where / "accelkit-manifest.json").is_file():
        return where / "dcp"
    shutil.rmtree(where, ignore_errors=True)
    (where / "dcp").mkdir(parents=True)
    for file in dcp_dir.iterdir():
        if file.name != "BENCH_DONE":
            os.link(file, where / "dcp" / file.name)
    source = (Path(__file__).resolve().parent.parent / "templates" / "minimal" / "train.py").read_text()
    block = source[source.index('# >>> shared block "manifest"'):source.index('# <<< shared block "manifest"')]
    namespace: dict = {}
    exec("from __future__ import annotations\nimport hashlib, json\nfrom pathlib import Path\n" + block, namespace)

    class MainProcess:
        is_main_process, num_processes = True, 2

        def wait_for_everyone(self) -> None:
            pass

    namespace["write_manifest"](MainProcess(), where, 1, "benchmark")
    return where / "dcp"


def measure(cmd: list[str], output: Path | None = None) -> dict:
    """Run cmd in a fresh wrapper process (after removing its `output`); its wall time, and the peak RSS and CPU
    time of the command."""
    if output is not None:
        _clear(output)
    out = subprocess.run([sys.executable, __file__, "--measure", "--", *cmd], capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _measure_child(cmd: list[str]) -> None:
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        print(proc.stderr[-3000:], file=sys.stderr)
        sys.exit(proc.returncode)
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(json.dumps({"seconds": seconds, "peak_rss": usage.ru_maxrss * 1024, "cpu": usage.ru_utime + usage.ru_stime,
                      "stdout": proc.stdout[-4000:]}))


def dir_bytes(path: Path) -> int:
    return path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _clear(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()


def _timed(line: str, stdout: str) -> float:
    """The seconds accelkit reports for one of its checks, e.g. 'CRC-32 of 1.02 GB of zip records read (0.21 s)'."""
    for text in stdout.splitlines():
        if line in text and text.rstrip().endswith(" s)"):
            return float(text.rsplit("(", 1)[1].split()[0])
    return 0.0


def read_files(src: Path) -> list[str]:
    """The files a merge of `src` reads (DeepSpeed: the tag folder `latest` names), for the read baseline."""
    if (src / "latest").is_file():
        src = src / (src / "latest").read_text().strip()
    return sorted(str(p) for p in src.rglob("*") if p.is_file() and p.name != "BENCH_DONE")


def _in_process(stdout: str) -> float:
    """The time accelkit reports for the merge itself ('Time: 5.3 s, ...'): the process's wall time less Python's
    start and the imports (torch), which every tool here pays and no merge can avoid while it imports torch."""
    for text in stdout.splitlines():
        if text.startswith("Time:"):
            return float(text.split()[1])
    return 0.0


def run_model(model_name: str, cache: Path, work: Path, runs: int,
              before: Path | None = None) -> tuple[list[tuple], list[tuple]]:
    ckpts = ensure_checkpoints(cache, model_name)
    py = sys.executable
    accelkit = [py, "-m", "accelkit", "merge-ckpt"]
    old = [py, "-c", f"import sys; sys.path.insert(0, {str(before)!r}); from accelkit.cli import main; "
                     "sys.argv[0] = 'accelkit'; main()", "merge-ckpt"] if before else None
    cases = [("DCP (FSDP2)", ckpts["dcp"], "accelerate merge-weights",
              lambda out: [py, "-m", "accelerate.commands.accelerate_cli", "merge-weights", str(ckpts["dcp"]),
                           str(out)])]
    for stage in ("zero2", "zero3"):
        cases.append((f"DeepSpeed ZeRO-{stage[-1]}", ckpts[stage], "DeepSpeed zero_to_fp32.py",
                      lambda out, s=stage: [py, str(ckpts[s] / "zero_to_fp32.py"), str(ckpts[s]), str(out),
                                            "--safe_serialization"]))
    rows, checks = [], []
    for label, src, peer, peer_cmd in cases:
        ours_out, peer_out = work / "ours.safetensors", work / "peer"
        results: dict[str, list[dict]] = {"ours": [], "peer": [], "nochecks": [], "before": [], "cp": [], "read": [],
                                          "bytes": []}
        copy_out, bytes_out = work / "copy", work / "bytes-copy.safetensors"
        tools = [("ours", [*accelkit, str(src), "-o", str(ours_out), "-q"], ours_out),
                 ("peer", peer_cmd(peer_out), peer_out),
                 ("nochecks", [py, "-c", NO_CHECKS, "merge-ckpt", str(src), "-o", str(ours_out), "-q"], ours_out),
                 ("bytes", ["cp", str(ours_out), str(bytes_out)], bytes_out),  # the output nochecks just wrote
                 ("cp", ["cp", "-r", str(src), str(copy_out)], copy_out),
                 ("read", ["sh", "-c", 'cat "$@" > /dev/null', "read", *read_files(src)], None)]
        if old:
            tools.append(("before", [*old, str(src), "-o", str(ours_out), "-q"], ours_out))
        for _ in range(runs):
            for key, cmd, out in tools:
                print(f"  {model_name} {label}: {key} ...", file=sys.stderr)
                results[key].append(measure(cmd, out))
        _clear(copy_out)
        _clear(bytes_out)
        size = dir_bytes(ours_out) / 1e9
        ours, theirs = _median(results["ours"]), _median(results["peer"])
        copy = _median(results["bytes"])
        rows.append((f"{model_name} {label}", "accelkit merge-ckpt", ours, size, theirs, copy))
        if old:
            rows.append((f"{model_name} {label}", "accelkit merge-ckpt (--before tree)", _median(results["before"]),
                         size, theirs, copy))
        rows.append((f"{model_name} {label}", peer, theirs, dir_bytes(peer_out) / 1e9, None, copy))
        rows.append((f"{model_name} {label}", "cp of the bytes merged (baseline)", copy, size, None, None))
        rows.append((f"{model_name} {label}", "cp -r of the checkpoint", _median(results["cp"]), dir_bytes(src) / 1e9,
                     None, None))
        read_bytes = sum(Path(f).stat().st_size for f in read_files(src)) / 1e9
        rows.append((f"{model_name} {label}", "read the files merged (cat)", _median(results["read"]), read_bytes,
                     None, None))
        crc = statistics.median(_timed("CRC-32 of", r["stdout"]) for r in results["ours"])
        scan = statistics.median(_timed("no NaN or inf", r["stdout"]) for r in results["ours"])
        inside = statistics.median(_in_process(r["stdout"]) for r in results["ours"])
        checks.append((f"{model_name} {label}", ours["seconds"], _median(results["nochecks"])["seconds"], crc, scan,
                       inside))
        if label.startswith("DCP"):
            signed = with_manifest(src, cache / f"{model_name}-with-manifest")
            hashed = _median([measure([*accelkit, str(signed), "-o", str(ours_out), "-q"], ours_out)
                              for _ in range(runs)])
            checks.append((f"{model_name} {label} + manifest", hashed["seconds"], ours["seconds"], None, None, None))
        _clear(ours_out)
        _clear(peer_out)
    return rows, checks


def vs_copy(cache: Path, work: Path, runs: int, before: Path | None) -> None:
    """Issue 45's comparison: the merge against a copy of what it merges, alternating, medians side by side."""
    ckpts = ensure_checkpoints(cache, "llama-217m", kinds=("dcp", "zero2"))
    py = sys.executable
    trees = [("now", [py, "-m", "accelkit", "merge-ckpt"])]
    if before:
        trees.append(("before", [py, "-c", f"import sys; sys.path.insert(0, {str(before)!r}); from accelkit.cli "
                                           "import main; sys.argv[0] = 'accelkit'; main()", "merge-ckpt"]))
    load = [os.getloadavg()[0]]
    rows = []
    for label, kind in (("DCP (FSDP2)", "dcp"), ("DeepSpeed ZeRO-2", "zero2")):
        src, out, copy_out = ckpts[kind], work / "ours.safetensors", work / "copy"
        results: dict[str, list[dict]] = {name: [] for name, _ in trees}
        results["copy"] = []
        subprocess.run([*trees[0][1], str(src), "-o", str(out), "-q"], check=True, capture_output=True)  # warm
        copied = shutil.copy(out, work / "bytes.safetensors")
        copy_cmd = ["cp", "-r", str(src), str(copy_out)] if kind == "dcp" else ["cp", copied, str(copy_out)]
        for _ in range(runs):
            for name, cmd in trees:
                results[name].append(measure([*cmd, str(src), "-o", str(out), "-q"], out))
            results["copy"].append(measure(copy_cmd, copy_out))
            load.append(os.getloadavg()[0])
        copy = _median(results["copy"])
        for name, _ in trees:
            ours = _median(results[name])
            rows.append((label, name, ours, copy, dir_bytes(src if kind == "dcp" else Path(copied)) / 1e9))
        for path in (out, copy_out, Path(copied)):
            _clear(path)
    print(f"\nmedian of {runs} alternating runs (merge, copy, ...); {os.cpu_count()} CPUs, 1-min load average "
          f"{min(load):.1f}-{max(load):.1f} during the runs\n")
    print("| llama-217m | accelkit | merge wall (s) | merge CPU (s) | peak RSS (MB) | copy | copy wall (s) | "
          "copy CPU (s) | merge / copy |")
    print("|---|---|---:|---:|---:|---|---:|---:|---:|")
    for label, name, ours, copy, size in rows:
        what = "`cp -r` of the checkpoint" if label.startswith("DCP") else "`cp` of the bytes merged"
        print(f"| {label} | {name} | {ours['seconds']:.2f} | {ours['cpu']:.2f} | {ours['peak_rss'] / 2**20:.0f} | "
              f"{what} ({size:.2f} GB) | {copy['seconds']:.2f} | {copy['cpu']:.2f} | "
              f"{ours['seconds'] / copy['seconds']:.2f}x |")


def _median(results: list[dict]) -> dict:
    return {key: statistics.median(r[key] for r in results) for key in ("seconds", "peak_rss", "cpu")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "accelkit-bench-merge")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--before", type=Path, help="also run accelkit from this source tree, alternately")
    parser.add_argument("--vs-copy", action="store_true", help="only the merge against a copy (issue 45)")
    parser.add_argument("--produce", nargs=3, metavar=("MODEL", "KIND", "OUT"), help=argparse.SUPPRESS)
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("rest", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        _measure_child(args.rest)
        return
    if args.produce:
        produce(args.produce[0], args.produce[1], Path(args.produce[2]))
        return

    for tree in (Path(__file__).resolve().parent.parent, args.before):
        if tree is not None:  # bytecode compiled as pip compiles it at install (this machine never writes it)
            subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree / "accelkit")], check=True)
    work = args.cache / "outputs"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    if args.vs_copy:
        vs_copy(args.cache, work, args.runs, args.before)
        return
    rows, checks = [], []
    for model_name in args.models.split(","):
        model_rows, model_checks = run_model(model_name, args.cache, work, args.runs, args.before)
        rows += model_rows
        checks += model_checks
    print(f"\nmedian of {args.runs} runs per tool, runs alternating; {os.cpu_count()} CPUs, load average "
          f"{' / '.join(f'{x:.1f}' for x in os.getloadavg())} (1 / 5 / 15 min) at the end\n")
    print("| input | tool | wall (s) | CPU (s) | peak RSS (MB) | GB | / peer: wall, RSS | / copy: wall, CPU |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for label, tool, result, size, peer, copy in rows:
        ratio = f"{result['seconds'] / peer['seconds']:.2f}x, {result['peak_rss'] / peer['peak_rss']:.2f}x" \
            if peer else ""
        to_copy = f"{result['seconds'] / copy['seconds']:.1f}x, {result['cpu'] / max(copy['cpu'], 1e-3):.1f}x" \
            if copy else ""
        print(f"| {label} | {tool} | {result['seconds']:.2f} | {result['cpu']:.2f} | "
              f"{result['peak_rss'] / 2**20:.0f} | {size:.2f} | {ratio} | {to_copy} |")
    print("\nIntegrity checks (CRC-32 of every record read, non-finite scan; a manifest's sha256 when there is one):\n")
    print("| input | merge (s) | of which in the merge (s) | without checks (s) | cost | CRC-32 (s) | "
          "non-finite scan (s) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for label, with_checks, without, crc, scan, inside in checks:
        cost = (with_checks - without) / with_checks
        crc_text = f"{crc:.2f}" if crc is not None else "-"
        scan_text = f"{scan:.2f}" if scan is not None else "-"
        inside_text = f"{inside:.2f}" if inside is not None else "-"
        print(f"| {label} | {with_checks:.2f} | {inside_text} | {without:.2f} | {cost:+.0%} | {crc_text} | "
              f"{scan_text} |")


if __name__ == "__main__":
    main()
