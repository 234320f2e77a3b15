"""The invariants of correct data parallelism, judged from what the probes recorded in both runs.

What can be compared between a 1-process and an N-process run, and what cannot: after a step the converted run's
weights legitimately differ from the original's (its global batch is N times larger), so weights are compared
across the ranks of the converted run, and with a third run, the original on 1 process at the global batch, fed
the ranks' samples of each step together (equivalence.py; where both must be equal: the same samples and learning
rates, no BatchNorm, no random draw in the step). Learning rates are compared with the original's at the same point of
training: the same epoch and the same fraction of it (a per-batch scheduler prepared by Accelerate steps N times
per step, so after k steps on N ranks it is where the original is after N*k). Samples are compared as sets of
dataset indices per epoch. Metrics are compared at equal weights: the original loads the converted run's weights
before each evaluation pass (see probe.py), so the numbers it prints are the one-process value for the same model.
"""

from __future__ import annotations

import functools
import re
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from accelkit.convert.check.equivalence import Equivalence
from accelkit.convert.check.probe_metrics import NUMBER
from accelkit.convert.check.record import Pass, Record, Step, a_look_at_the_data

PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"
LR_RTOL = 1e-6
# weights of the conversion against the original's at the global batch: the largest |difference| of a parameter
# over its largest |value| (fp32 sums in another order differ by ~1e-7 per step; half the gradient, by far more)
WEIGHTS_RTOL = 1e-4
# metrics of an evaluation that draws random numbers: the processes draw other numbers than the one process; a
# sample counted twice or a metric left per process is off by far more (pytorch/examples vae: 33%; its draw: 0.02%)
RANDOM_EVALUATION_TOLERANCE = 0.02
TIME_UNIT = re.compile(r"^\s*(?:s|sec|secs|seconds|ms|it/s|s/it|samples/s)\b")


@dataclass(frozen=True)
class Verdict:
    name: str
    status: str  # PASS | FAIL | SKIP
    summary: str
    evidence: tuple[str, ...] = ()
    fix: str = ""  # a FAIL that is the check's own limit (not the conversion's fault): the option that lifts it


@dataclass(frozen=True)
class Runs:
    original: Record | None
    converted: list[Record]  # one per rank, by rank
    world: int
    iteration_based: bool  # no epochs (random batches): progress is the step count, not the fraction of an epoch
    evaluation_loops: tuple[int, ...] = ()  # lines of the original's loops over a loader that do not train
    steps: int = 0  # the check's --steps: optimizer steps of the converted run before it is stopped
    full_batch: bool = False  # the script trains on all its data every step (a graph): every rank sees all of it
    evaluation_every: tuple[int, ...] = ()  # N of evaluations the script runs every N training steps
    equivalence: Equivalence | None = None  # the original on 1 process at the global batch (None: not run)


def evaluate(runs: Runs) -> list[Verdict]:
    return [wrapped(runs), weights(runs), learning_rates(runs), samples(runs), metrics(runs), side_effects(runs)]


# -- every trainable module wrapped -----------------------------------------------------------------------------
def wrapped(runs: Runs) -> Verdict:
    name = "wrapped"
    rank0 = runs.converted[0] if runs.converted else None
    if rank0 is None or not rank0.steps:
        taken = len(runs.original.steps) if runs.original is not None else 0
        if rank0 is not None and taken:
            return Verdict(name, FAIL, f"the converted run reached no training step (no backward pass, no optimizer "
                                       f"step) where the original took {taken}: nothing of it could be checked")
        return Verdict(name, SKIP, "no training step in either run (see `ran`)")
    wrapper = "FSDP" if rank0.backend == "fsdp" else "DDP"
    owns = "FSDP shards" if wrapper == "FSDP" else "DDP wrapper owns"
    if rank0.unwrapped:
        evidence = []
        for item in rank0.unwrapped:
            owner = ", ".join(item["owners"]) or "a module the script does not hold in a variable at the step"
            evidence.append(f"optimizer #{item['optimizer']} ({item['kind']}) updates {item['tensors']} parameter "
                            f"tensor(s) ({item['numel']:,} values) that no {owns}: {owner}")
        return Verdict(name, FAIL, "a trained module was not prepared: each process trains its own copy",
                       tuple(evidence))
    trained = [m for m in rank0.models if m["trained"]]
    bare = [m["name"] for m in trained if not m["wrapper"]]
    if not rank0.optimizers and bare:
        return Verdict(name, FAIL, "a trained module was not prepared: each process trains its own copy",
                       tuple(f"{n} is trained (called with gradients) but not wrapped by {wrapper}" for n in bare))
    if not rank0.wrapped:
        return Verdict(name, FAIL, f"no module was wrapped by {wrapper}")
    optimizers = f", {len(rank0.optimizers)} optimizer(s)" if rank0.optimizers else ""
    how = "sharded by FSDP (fully_shard)" if wrapper == "FSDP" else "wrapped by DDP"
    return Verdict(name, PASS, f"every trained module is {how}: {', '.join(rank0.wrapped)}{optimizers}")


# -- weights identical across ranks after every step ------------------------------------------------------------
def _steps(record: Record) -> list[Step]:
    real = [s for s in record.steps if s.optimizer >= 0]
    return real if real else record.steps


def weights(runs: Runs) -> Verdict:
    name = "weights"
    ranks = runs.converted
    if len(ranks) < 2 or not ranks[0].steps:
        return Verdict(name, SKIP, "no training step was reached on 2 ranks")
    per_rank = [_steps(r) for r in ranks]
    manual = per_rank[0][0].optimizer < 0
    units = "backward passes" if manual else "steps"
    for position, step in enumerate(per_rank[0]):
        others = [(r, steps[position]) for r, steps in enumerate(per_rank) if position < len(steps)]
        digests = {s.digest for _, s in others}
        if len(digests) > 1 or len(others) < len(per_rank):
            label = _step_label(step, manual)
            evidence = [f"rank {r}: {s.digest}" for r, s in others]
            if len(others) < len(per_rank):
                counts = ", ".join(f"rank {r}: {len(s)}" for r, s in enumerate(per_rank))
                return Verdict(name, FAIL, f"the ranks took different numbers of {units} ({counts})",
                               tuple(evidence))
            befores = {s.before for _, s in others if s.before is not None}
            if len(befores) > 1:
                why = ("the ranks started from different weights: the model was changed after accelerator.prepare() "
                       "wrapped it (DDP copies rank 0's weights only when it wraps), or it was never wrapped")
            elif manual:
                why = "the ranks updated their weights differently (gradients not averaged across processes)"
            else:
                why = "the ranks applied different updates (gradients not averaged, or an unprepared model/optimizer)"
            what = "before" if manual else "after"
            return Verdict(name, FAIL, f"weights differ across ranks {what} {label}: {why}", tuple(evidence))
    lengths = {len(s) for s in per_rank}
    if len(lengths) > 1:
        counts = ", ".join(f"rank {r}: {len(s)}" for r, s in enumerate(per_rank))
        return Verdict(name, FAIL, f"the ranks took different numbers of {units} ({counts})")
    count = len(per_rank[0])
    what = f"before each of {count} backward passes" if manual else f"after each of {count} optimizer steps"
    gathered = " (full parameters gathered from the FSDP shards)" if ranks[0].backend == "fsdp" else ""
    failed, against = _against_original(runs, manual)
    if failed is not None:
        return failed
    return Verdict(name, PASS, f"identical on all {len(ranks)} ranks {what}{gathered}{against}")


def _global_batch(record: Record) -> str:
    sizes = sorted({(a, b) for a, b in record.batch_scaled})
    return ", ".join(f"{b} ({a} per rank)" for a, b in sizes)


def _same_samples_until(runs: Runs, original: Record) -> int:
    """How many clock steps, from the first, trained on the same samples in both runs (the rows of the N ranks'
    inputs together against the one process's); 0 when the probe saw no rows."""
    count = 0
    for position, rows in enumerate(original.step_rows):
        ours: Counter[str] = Counter()
        for record in runs.converted:
            ours.update(record.step_rows[position] if position < len(record.step_rows) else [])
        if ours != Counter(rows):
            break
        count += 1
    seen = any(original.step_rows[:count])
    return count if seen else 0


def _against_original(runs: Runs, manual: bool) -> tuple[Verdict | None, str]:
    """Compare rank 0's weights with the equivalence run's (the original on 1 process at the global batch) after
    every step both kept: a FAIL verdict, or the words the PASS line adds."""
    found = runs.equivalence
    if found is None:
        return None, ""
    rank0, original = runs.converted[0], found.record
    apart = "; not compared with the original on 1 process at the global batch: "
    if manual:
        return None, apart + "no optimizer step (weights updated by hand)"
    if original is None or found.failure:
        return None, apart + f"it did not run there ({found.failure or 'it recorded nothing'})"
    if not original.batch_scaled:
        return None, apart + "no DataLoader with a batch size the check could set to the global batch"
    batch = _global_batch(original)
    compared_runs = (f"the original on 1 process with its DataLoader batch set by the check to {batch}, "
                     f"against the conversion on {runs.world} ranks")
    norms = sorted({*original.batch_norm, *rank0.batch_norm})
    if norms:
        return None, apart + (f"{', '.join(norms)} normalises over each process's own batch (SyncBatchNorm "
                              "would not)")
    if any(original.step_draws) or any(d for r in runs.converted for d in r.step_draws):
        return None, apart + ("the training step draws random numbers (dropout, noise): the processes draw "
                              "others than the one process")
    same_until = _same_samples_until(runs, original)
    if not same_until:
        return None, apart + ("its first step trained on other samples than the ranks' first steps together "
                              "(shuffled in another order, or inputs the probe cannot see)")
    differences = {d.position: d for d in found.differences}
    ours = [(i, s) for i, s in enumerate(rank0.steps) if s.optimizer >= 0]
    theirs = [(i, s) for i, s in enumerate(original.steps) if s.optimizer >= 0]
    compared = 0
    stopped = ""
    for count, ((i, step), (j, other)) in enumerate(zip(ours, theirs, strict=False), start=1):
        if i != j or step.optimizer != other.optimizer:
            break  # the runs stepped their optimizers in another order: nothing after this lines up
        if _lrs_differ(step.lrs, other.lrs):
            # a schedule counted in steps (a warm-up of K steps) sits elsewhere at N times the batch; the `lr` line
            # compares it with the original at the same point of training
            stopped = (f" (from step {count} on the learning rate differs from the one process's at the global "
                       "batch: a schedule counted in steps)")
            break
        # the clock steps so far (a first backward pass before any optimizer step counts as one)
        clock_steps = sum(1 for s in rank0.steps[:i + 1] if s.is_clock)
        if clock_steps > same_until or (not step.is_clock and clock_steps >= same_until):
            break  # from here on the runs trained on other samples
        difference = differences.get(i)
        if difference is None:
            continue
        if difference.relative > WEIGHTS_RTOL:
            label = f"step {count}" + (f" (optimizer #{step.optimizer})" if len(rank0.optimizers) > 1 else "")
            return Verdict("weights", FAIL, f"after {label} the weights differ from the original's on 1 process at "
                                            f"the global batch: {difference.parameter} by {difference.relative:.3g} "
                                            f"relative (tolerance {WEIGHTS_RTOL:g})",
                           (f"compared: {compared_runs}, after every optimizer step",
                            "the ranks together apply another update than the original: a loss summed over each "
                            "process's batch (reduction='sum') is averaged over the processes by DDP/FSDP (scale "
                            "it by accelerator.num_processes), or the gradients are scaled per process")), ""
        compared += 1
    if not compared:
        return None, apart + "no step with the same samples and weights kept in both runs" + stopped
    return None, (f"; equal to the original's within {WEIGHTS_RTOL:g} relative after {compared} of {len(ours)} "
                  f"step(s) ({compared_runs}){stopped}")


def _lrs_differ(ours: list[float], theirs: list[float]) -> bool:
    return len(ours) != len(theirs) or any(abs(a - b) > LR_RTOL * max(abs(a), abs(b), 1e-30)
                                           for a, b in zip(ours, theirs, strict=True))


def _step_label(step: Step, manual: bool) -> str:
    if manual:
        return f"backward pass {step.number}"
    return f"step {step.number} (optimizer #{step.optimizer})"


# -- learning rates equal to the original's at the same point of training ---------------------------------------
def _on_both_runs(name: str) -> Callable[[Callable[[Runs, Record, Record], Verdict]], Callable[[Runs], Verdict]]:
    """An invariant over the original's record and rank 0's (`check(runs, original, rank0)`), skipped when a run
    recorded nothing."""
    def wrap(check: Callable[[Runs, Record, Record], Verdict]) -> Callable[[Runs], Verdict]:
        @functools.wraps(check)
        def verdict(runs: Runs) -> Verdict:
            if runs.original is None or not runs.converted:
                return Verdict(name, SKIP, "a run recorded nothing")
            return check(runs, runs.original, runs.converted[0])
        return verdict
    return wrap


@_on_both_runs("lr")
def learning_rates(runs: Runs, original: Record, rank0: Record) -> Verdict:
    name = "lr"
    ours = [s for s in rank0.steps if s.optimizer >= 0]
    theirs = [s for s in original.steps if s.optimizer >= 0]
    if not rank0.steps:
        return Verdict(name, SKIP, "no training step was reached (see `ran` and `wrapped`)")
    if not ours:
        return Verdict(name, SKIP, "no optimizer step (weights updated by hand): no learning rate to compare")
    by_optimizer: dict[int, list[Step]] = defaultdict(list)
    for step in theirs:
        by_optimizer[step.optimizer].append(step)
    counts: Counter[int] = Counter()
    compared = 0
    first_last: dict[int, list[float]] = {}
    for step in ours:
        counts[step.optimizer] += 1
        match, where = _aligned(step, counts[step.optimizer], by_optimizer[step.optimizer], runs)
        if match is None:
            continue
        compared += 1
        first_last.setdefault(step.optimizer, [step.lrs[0], step.lrs[0]])[1] = step.lrs[0]
        if len(match.lrs) != len(step.lrs) or any(abs(a - b) > LR_RTOL * max(abs(a), abs(b), 1e-30)
                                                  for a, b in zip(step.lrs, match.lrs, strict=False)):
            ours_text = ", ".join(f"{v:.6g}" for v in step.lrs)
            theirs_text = ", ".join(f"{v:.6g}" for v in match.lrs)
            return Verdict(name, FAIL, f"step {counts[step.optimizer]} of optimizer #{step.optimizer} used lr "
                                       f"{ours_text} on {runs.world} processes; the original used {theirs_text} at the "
                                       f"same point of training ({where})",
                           ("a prepared scheduler steps once per process per call: right for a per-batch scheduler, "
                            f"{runs.world}x too fast for one stepped per epoch; an unprepared per-batch scheduler is "
                            f"{runs.world}x too slow",))
    if not compared:
        return Verdict(name, SKIP, "the original did not reach the points of training the converted run did")
    ranges = "; ".join(f"optimizer #{k}: {a:.6g} -> {b:.6g}" for k, (a, b) in sorted(first_last.items()))
    return Verdict(name, PASS, f"equal to the original's at the same point of training at {compared} step(s) "
                               f"({ranges})")


def _aligned(step: Step, index: int, theirs: list[Step], runs: Runs) -> tuple[Step | None, str]:
    """The original's step at the same point of training as the converted run's `index`-th step."""
    progress = step.progress
    if progress is not None and progress[3] > 0 and not runs.iteration_based:
        loader, number, taken, length = progress
        candidates = [s for s in theirs if s.progress and s.progress[0] == loader and s.progress[1] == number
                      and s.progress[3] > 0]
        if candidates:
            ratio = candidates[0].progress[3] / length  # type: ignore[index]
            target = round((taken - 1) * ratio) + 1  # batches seen before this one, scaled, plus this one
            before = [s for s in candidates if s.progress[2] <= target]  # type: ignore[index]
            if before:
                match = max(before, key=lambda s: s.progress[2])  # type: ignore[index]
                return match, (f"epoch {number + 1}, batch {match.progress[2]} of {match.progress[3]}; here batch "  # type: ignore[index]
                               f"{taken} of {length} on each process")
            return None, ""
    target_index = index if runs.iteration_based else round(_original_steps_per_step(runs) * (index - 1)) + 1
    if target_index <= len(theirs):
        return theirs[target_index - 1], f"its step {target_index}"
    return None, ""


def _original_steps_per_step(runs: Runs) -> float:
    """How many of the original's optimizer steps one step of the conversion covers: N (each rank trains on its own
    batch), fewer when each rank accumulates fewer backward passes per step than the original did: a script that
    keeps its global batch fixed (build-nanogpt: `grad_accum_steps = total_batch_size // (B * T * world_size)`).
    One on a full batch (every rank trains on all the data, as the original's every step does)."""
    if runs.full_batch:
        return 1
    ours = _backward_passes_per_step(runs.converted[0]) if runs.converted else None
    theirs = _backward_passes_per_step(runs.original) if runs.original is not None else None
    if not ours or not theirs:
        return runs.world
    return runs.world * ours / theirs


def _backward_passes_per_step(record: Record) -> float | None:
    clock = [s for s in record.steps if s.is_clock and s.optimizer >= 0]
    return record.backward_passes / len(clock) if clock and record.backward_passes else None


# -- each sample seen once per epoch across ranks ---------------------------------------------------------------
def samples(runs: Runs) -> Verdict:
    name = "samples"
    ranks = runs.converted
    if not ranks:
        return Verdict(name, SKIP, "no run recorded anything")
    keys = sorted({(p.loader, p.number) for r in ranks for p in r.passes})
    if not keys:
        return _fingerprints(runs)
    original_passes = {(p.loader, p.number): p for p in runs.original.passes} if runs.original else {}
    checked: list[str] = []
    training_loaders: set[int] = set()
    streams: dict[int, list[str]] = defaultdict(list)  # IterableDataset loader -> what was checked, per epoch
    looks: list[str] = []  # passes that every rank took alike before prepare: nothing to shard
    for key in keys:
        passes = [next((p for p in r.passes if (p.loader, p.number) == key), None) for r in ranks]
        present = [p for p in passes if p is not None]
        if present and any(p.stream and p.rows for p in present):
            kind = "training" if any(p.steps for p in present) else "evaluation"
            problem, what = _stream_problem(passes, original_passes.get(key), runs.world)
            if problem:
                return Verdict(name, FAIL, f"{kind} loader #{key[0]} (IterableDataset), epoch {key[1] + 1}: "
                                           f"{problem[0]}", problem[1])
            streams[key[0]].append(what)
            if kind == "training":
                training_loaders.add(key[0])
            continue
        if not present or not any(p.indices for p in present):
            continue
        if a_look_at_the_data(passes):
            looks.append(f"loader #{key[0]}")
            continue
        if any(p.steps for p in present):
            training_loaders.add(key[0])
        problem = _pass_problem(key, passes, original_passes.get(key), runs.world)
        if problem:
            kind = "training" if any(p.steps for p in present) else "evaluation"
            return Verdict(name, FAIL, f"{kind} loader #{key[0]}, epoch {key[1] + 1}: {problem[0]}", problem[1])
        checked.append(f"{key[0]}:{key[1]}")
    if not checked and not streams:
        return _fingerprints(runs) if not training_loaders else Verdict(name, SKIP, "no sample index was recorded")
    loaders = Counter(k.split(":")[0] for k in checked)
    described = ", ".join(f"loader #{k} ({'training' if int(k) in training_loaders else 'evaluation'}, "
                          f"{n} epoch(s))" for k, n in sorted(loaders.items()))
    parts = [f"each sample seen once per epoch across the {runs.world} ranks: {described}"] if described else []
    for loader, whats in sorted(streams.items()):
        kind = "training" if loader in training_loaders else "evaluation"
        epochs = "; ".join(f"{n} epoch(s): {what}" for what, n in Counter(whats).items())
        parts.append(f"IterableDataset loader #{loader} ({kind}, samples compared by content): {epochs}")
    if looks:
        parts.append(f"the same batches of {', '.join(sorted(set(looks)))} read alike by every rank, without training "
                     "(a look at the data before prepare shards the loader)")
    return Verdict(name, PASS, "; ".join(parts))


STREAM_ALL = "every sample of the one-process epoch taken, each by one rank"
STREAM_DISJOINT = "no sample taken by two ranks"


def _stream_problem(passes: list[Pass | None], original: Pass | None, world: int):
    """An IterableDataset's epoch, by the samples' content (a hash of each row the script took): no sample on two
    ranks (beyond Accelerate's padding of the last batch), and, when both runs finished the epoch with the same
    samples, none missed. Returns (problem or None, what was checked)."""
    taken: Counter[str] = Counter()
    ranks_of: dict[str, set[int]] = defaultdict(set)
    for rank, p in enumerate(passes):
        for row, count in (p.rows if p else {}).items():
            taken[row] += count
            ranks_of[row].add(rank)
    once = original.rows if original is not None and original.complete and original.rows else None
    complete = all(p is not None and p.complete for p in passes)
    extra = sum(taken[row] - max(1, (once or {}).get(row, 1)) for row, rs in ranks_of.items() if len(rs) > 1)
    batch = max((p.batch_size for p in passes if p is not None), default=-1)
    allowed = 0
    if complete and batch > 0:  # the last batch evened out with samples from the epoch's start (even_batches)
        allowed = (-sum(once.values())) % (world * batch) if once else world * batch - 1
    if extra > max(allowed, 0):
        shared = sum(1 for rs in ranks_of.values() if len(rs) > 1)
        return ((f"{shared} sample(s) taken by more than one rank: the stream is not sharded across processes",
                 (f"{len(taken)} distinct samples, {sum(taken.values())} taken over {len(passes)} ranks",)),
                "")
    if not complete:
        return None, f"{STREAM_DISJOINT} (the converted run stopped within the epoch: missed samples not checked)"
    if once is None:
        return None, f"{STREAM_DISJOINT} (the one-process run did not finish this epoch: missed samples not checked)"
    if set(taken) - set(once):
        return None, (f"{STREAM_DISJOINT} (its samples differ from the one-process run's, e.g. drawn at random: missed "
                      "samples not checked)")
    missing = set(once) - set(taken)
    if missing:
        return ((f"{len(missing)} of {len(once)} sample(s) of the epoch taken by no rank",
                 ("the one-process run took every one of them",)), "")
    if extra:
        return None, f"{STREAM_ALL} ({extra} taken again to even out the last batch)"
    return None, STREAM_ALL


def _pass_problem(key, passes: list[Pass | None], original: Pass | None, world: int):
    if any(p is not None and p.replacement for p in passes):
        return None  # sampled with replacement: a sample on two ranks, or none, is what the sampler does
    seen_by: dict[int, list[int]] = defaultdict(list)
    for rank, p in enumerate(passes):
        for index in (p.indices if p else ()):
            seen_by[index].append(rank)
    shared = sorted(i for i, rs in seen_by.items() if len(set(rs)) > 1)
    complete = all(p is not None and p.complete for p in passes)
    batch = max((p.batch_size for p in passes if p is not None), default=-1)
    length = max((p.dataset_length for p in passes if p is not None), default=-1)
    fetched = sum(len(p.indices) for p in passes if p is not None)
    # Accelerate evens out the last batch of an epoch by repeating samples from its start (even_batches)
    padding_allowed = 0
    if batch > 0 and length > 0 and length % (world * batch) and fetched >= length:
        padding_allowed = world * batch - length % (world * batch)
    if len(shared) > padding_allowed:
        example = shared[0]
        ranks = sorted(set(seen_by[example]))
        return (f"{len(shared)} sample(s) seen by more than one rank (sample {example}: ranks "
                f"{', '.join(map(str, ranks))}): the data is not sharded across processes",
                (f"{len(seen_by)} distinct samples, {sum(len(v) for v in seen_by.values())} fetched over "
                 f"{len(passes)} ranks",))
    if not complete:
        return None
    if original is not None and original.complete and original.indices:
        expected = set(original.indices)
    else:
        length = max((p.dataset_length for p in passes if p is not None), default=-1)
        expected = set(range(length)) if length > 0 else set(seen_by)
    missing = sorted(expected - set(seen_by))
    if missing:
        return (f"{len(missing)} of {len(expected)} sample(s) never seen in the epoch (e.g. {missing[:5]})",
                ("the original saw every one of them",))
    return None


def _fingerprints(runs: Runs) -> Verdict:
    """No DataLoader: compare the training inputs themselves. Ranks in lockstep that feed the same inputs at the
    same step train on the same batch (not sharded, or random batches drawn with one seed everywhere)."""
    name = "samples"
    ranks = runs.converted
    steps = [r.step_inputs for r in ranks]
    if len(ranks) < 2 or not any(any(s) for s in steps):
        return Verdict(name, SKIP, "no DataLoader and no training input to compare")
    compared = [j for j in range(min(len(s) for s in steps)) if all(s[j] for s in steps)]
    same = [j for j in compared if len({s[j] for s in steps}) == 1]
    union = len({key for r in ranks for key in r.fingerprints})
    if compared and runs.full_batch:
        if len(same) == len(compared):  # right for full-batch training: the same gradient on every rank
            return Verdict(name, PASS, f"full batch: every rank trained on all of the data at each of {len(compared)} "
                                       "steps, as the original does (no sharding to check)")
        return Verdict(name, FAIL, f"full batch: the ranks trained on different inputs at {len(compared) - len(same)} "
                                   f"of {len(compared)} steps, while the original trains on all of the data every "
                                   "step (the data was cut)", (f"{union} distinct training inputs",))
    if compared and len(same) * 2 > len(compared):
        return Verdict(name, FAIL, f"at {len(same)} of {len(compared)} steps every rank trained on the same inputs: "
                                   "the hand-made batches are not sharded across processes (or random batches are "
                                   "drawn with the same seed on every process)",
                       (f"{union} distinct training inputs over {len(ranks)} ranks",))
    shared = None if runs.iteration_based else _rows_on_several_ranks(runs)
    if shared is not None and shared[0] * SHARED_ROWS_ALLOWED[1] > shared[1] * SHARED_ROWS_ALLOWED[0]:
        return Verdict(name, FAIL, f"{shared[0]} of the {shared[1]} distinct training samples (rows of the model's "
                                   "input) were trained on by more than one rank: the hand-made batches overlap "
                                   "across processes (the data is reordered or offset per rank, not split)",
                       ("within each rank, no row was fed at two different steps",))
    return Verdict(name, PASS, f"no DataLoader: the ranks trained on different inputs at {len(compared) - len(same)} "
                               f"of {len(compared)} steps ({union} distinct inputs)")


# rows of the training inputs trained on by two ranks that still pass as split data (a row that happens to recur)
SHARED_ROWS_ALLOWED = (1, 10)


def _rows_on_several_ranks(runs: Runs) -> tuple[int, int] | None:
    """(rows trained on by more than one rank, distinct rows) for hand-made batches whose rows identify samples:
    within each rank, no row is fed at two different steps (a step fed again whole, the next epoch of unshuffled
    data, counts once). None when one is (a vocabulary's few values per row, reshuffled epochs): then a row on
    two ranks proves nothing."""
    ranks: dict[str, set[int]] = defaultdict(set)
    for rank, record in enumerate(runs.converted):
        seen: dict[str, str] = {}  # row -> the step (its digest) that fed it
        for digest, rows in zip(record.step_inputs, record.step_rows, strict=False):
            for row in rows:
                if seen.setdefault(row, digest) != digest:
                    return None
        for row in seen:
            ranks[row].add(rank)
    if not ranks:
        return None
    return sum(1 for owners in ranks.values() if len(owners) > 1), len(ranks)


# -- metrics equal to the one-process value ---------------------------------------------------------------------
@_on_both_runs("metrics")
def metrics(runs: Runs, original: Record, rank0: Record) -> Verdict:
    name = "metrics"
    evaluations = [p for p in rank0.passes if p.complete and not p.steps and p.batches]
    if not evaluations:
        return _no_evaluation(runs, rank0)
    compared = 0
    random_passes = 0
    for p in evaluations:
        key = f"{p.loader}:{p.number}"
        if key not in original.replayed:
            continue
        where = f"evaluation pass {p.number + 1} of loader #{p.loader} ({p.owner.split(':')[-1]})"
        one = next((q for q in original.passes if (q.loader, q.number) == (p.loader, p.number)), None)
        # an evaluation that draws random numbers (a VAE's sampling, dropout left on) gives each process other
        # draws than the one process: equal up to the draw, not to the last digit
        relative = RANDOM_EVALUATION_TOLERANCE if one is not None and one.draws else 1e-4
        random_passes += relative != 1e-4
        ours, theirs = rank0.returns.get(key), original.returns.get(key)
        if key in rank0.returns and key in original.returns and (ours, theirs) != (None, None):  # None: no number
            problem = _compare_values(ours, theirs, relative)
            if problem:
                return Verdict(name, FAIL, f"{where} returned {problem} (same weights on both sides)",
                               (f"{runs.world} processes: {ours!r}", f"1 process:   {theirs!r}"))
            compared += 1
        ours_lines = _lines_after(rank0, p)
        theirs_lines = _lines_after(original, one)
        for (line, mine), (other, theirs) in zip(ours_lines, theirs_lines, strict=False):
            positions = None if mine is None or theirs is None else sorted(set(mine) & set(theirs))
            if positions is not None and NUMBER.sub("#", line) != NUMBER.sub("#", other):
                continue  # a caller's lines differ in words (a path, a name): only its metrics are compared
            problem = _compare_line(line, other, positions, relative)
            if problem:
                by = "" if mine is None else ", printed by its caller"
                return Verdict(name, FAIL, f"after {where}{by}: {problem} (same weights on both sides)",
                               (f"{runs.world} processes: {line}", f"1 process:   {other}"))
            compared += 1 if positions is None else len(positions)
        if len(ours_lines) != len(theirs_lines):
            return Verdict(name, FAIL, f"after {where} the converted script printed {len(ours_lines)} line(s), the "
                                       f"original {len(theirs_lines)}",
                           tuple(t for t, _ in ours_lines[:3]) + tuple(t for t, _ in theirs_lines[:3]))
    if not compared:
        return Verdict(name, SKIP, "no evaluation pass printed or returned a metric")
    drawn = (f" ({random_passes} evaluation pass(es) draw random numbers: equal within "
             f"{RANDOM_EVALUATION_TOLERANCE:.0%})" if random_passes else "")
    return Verdict(name, PASS, f"{compared} metric(s) printed or returned after evaluation passes equal the "
                               f"one-process values at the same weights{drawn}")


def _no_evaluation(runs: Runs, rank0: Record) -> Verdict:
    """No evaluation pass was reached: nothing to check when the script has none (or ended without one), a FAIL
    when it has one and the check's step limit stopped the run before it."""
    name = "metrics"
    lines = ", ".join(map(str, runs.evaluation_loops))
    if not runs.evaluation_loops:
        return Verdict(name, SKIP, "the script has no evaluation loop over a DataLoader (a loop without a training "
                                   "step): no metric to compare")
    if rank0.reason != "step limit":
        return Verdict(name, SKIP, f"the script ended without running its evaluation loop (line {lines}) with these "
                                   "arguments: no metric to compare")
    needed = _steps_to_epoch_end(rank0)
    every = min(runs.evaluation_every, default=None)
    if every is not None and every + 1 > runs.steps:
        # `step % N == 0` with the counter at 0 on the first step: step N is the (N+1)-th optimizer step at most
        fix = f"--steps {every + 1}"
        why = (f"the script evaluates every {every} training steps (`% {every} == 0`), so the first evaluation "
               f"comes by step {every + 1}")
    elif needed is not None and needed + 1 > runs.steps:
        fix = f"--steps {needed + 1}"
        why = (f"an epoch is {needed} step(s) on each of the {runs.world} processes, so the first evaluation after "
               f"one comes at step {needed + 1}")
    else:
        fix = f"--steps {max(runs.steps, 1) * 4}"
        why = "the first evaluation comes later"
    return Verdict(name, FAIL, f"not checked: the script evaluates (loop at line {lines}) but the check stopped at "
                               f"its step limit ({len(_steps(rank0))} step(s)) before the first evaluation",
                   (f"{why}: raise the limit with {fix}",), fix=fix)


def _steps_to_epoch_end(record: Record) -> int | None:
    """Steps of one full training epoch, from the batches the last step had seen of its pass."""
    steps = [s for s in _steps(record) if s.progress and s.progress[3] > 0 and s.progress[2] > 0]
    if not steps:
        return None
    last = steps[-1]
    per_epoch = last.progress[3]  # type: ignore[index]
    same_pass = [s for s in steps if s.progress[:2] == last.progress[:2]]  # type: ignore[index]
    batches_per_step = last.progress[2] / len(same_pass)  # type: ignore[index]
    return max(1, -(-per_epoch // max(1, round(batches_per_step))))


def _compare_values(ours, theirs, relative: float = 1e-4) -> str | None:
    if isinstance(ours, dict) and isinstance(theirs, dict):
        for key in sorted(set(ours) | set(theirs)):
            problem = _compare_values(ours.get(key), theirs.get(key), relative)
            if problem:
                return f"{key}: {problem}"
        return None
    if isinstance(ours, list) and isinstance(theirs, list):
        if len(ours) != len(theirs):
            return f"{len(ours)} values where one process returns {len(theirs)}"
        for a, b in zip(ours, theirs, strict=True):
            problem = _compare_values(a, b, relative)
            if problem:
                return problem
        return None
    if isinstance(ours, (int, float)) and isinstance(theirs, (int, float)):
        if abs(ours - theirs) > relative * max(abs(ours), abs(theirs)) + 1e-9:
            return f"{ours:.6g} where one process returns {theirs:.6g}"
        return None
    if ours is None and theirs is None:
        return None
    return f"{ours!r} where one process returns {theirs!r}"


def _lines_after(record: Record, p: Pass | None) -> list[tuple[str, list[int] | None]]:
    """The lines printed after pass `p` ended and before the next loader event: the evaluating function's own
    (every number compared: None), and its callers' (only the numbers the probe traced to the evaluation)."""
    if p is None:
        return []
    tag = f"{p.loader}:{p.number}:end"
    lines = []
    for line in record.lines:
        line_tag, function, text = line[:3]
        if line_tag != tag:
            continue
        if function == p.owner:
            lines.append((text, None))
        elif len(line) > 3 and isinstance(line[3], list) and line[3]:  # a caller's line showing a metric
            lines.append((text, line[3]))
    return lines


def _compare_line(ours: str, theirs: str, positions: list[int] | None = None, relative: float = 1e-4) -> str | None:
    """Compare two printed lines number by number (all of them, or those at `positions`), each to the precision
    printed; the text around the numbers must be the same."""
    if NUMBER.sub("#", ours) != NUMBER.sub("#", theirs):
        return f"the lines differ: {ours!r} vs {theirs!r}"
    for i, (a, b, rest) in enumerate(zip(NUMBER.finditer(ours), NUMBER.finditer(theirs), _tails(ours),
                                         strict=False)):
        if positions is not None and i not in positions:
            continue  # a caller's figure that is not the evaluation's (the training loss, the epoch)
        if TIME_UNIT.match(rest):
            continue  # a duration, not a metric
        x, y = a.group(), b.group()
        if x == y:
            continue
        fx, fy = float(x), float(y)
        places = max(_decimals(x), _decimals(y))
        tolerance = max(relative * max(abs(fx), abs(fy)), 1.01 * 10 ** -places if places else 0.0)
        if abs(fx - fy) > tolerance:
            return f"{x} on {_label(ours, a.start())}where one process prints {y}"
    return None


def _tails(text: str):
    for match in NUMBER.finditer(text):
        yield text[match.end():]


def _decimals(number: str) -> int:
    mantissa = number.lower().split("e")[0]
    return len(mantissa.split(".")[1]) if "." in mantissa else 0


def _label(text: str, start: int) -> str:
    words = re.findall(r"[A-Za-z_][\w ]*", text[:start])
    return f"`{words[-1].strip()}` " if words else ""


# -- side effects on one process --------------------------------------------------------------------------------
def side_effects(runs: Runs) -> Verdict:
    name = "side effects"
    ranks = runs.converted
    writers: dict[str, list[int]] = defaultdict(list)
    for record in ranks:
        for path in record.files:
            writers[path].append(record.rank)
    shared = sorted(p for p, rs in writers.items() if len(rs) > 1)
    problems = [f"{p} written by ranks {', '.join(map(str, writers[p]))}" for p in shared[:5]]
    printed = {line[2] for line in runs.original.lines} if runs.original is not None else set()
    unedited: dict[str, list[str]] = defaultdict(list)
    for record in ranks[1:]:
        # a process without an Accelerator cannot tell it is not the main one, and a module beside the script is not
        # converted: a line from there that the original prints too is the original's own per-process output
        # (torchrun's N processes print it N times as well), not something the conversion added; a line the
        # original never prints was added by the conversion
        added = [text for _, text in record.unedited_lines if text not in printed]
        for why, text in record.unedited_lines:
            if text in printed:
                unedited[why].append(text)
        if added:
            problems.append(f"rank {record.rank} printed {len(added)} line(s) the original does not print, e.g. "
                            f"{added[0][:80]!r}")
        if record.stdout_lines:
            first = record.lines[0] if record.lines else ["", "", ""]
            where = f" from {first[1]}" if first[1] else ""
            problems.append(f"rank {record.rank} printed {record.stdout_lines} line(s){where}, e.g. {first[2][:80]!r} "
                            "(print only on the main process: accelerator.print)")
        if record.progress_writes:
            problems.append(f"rank {record.rank} drew a progress bar ({record.progress_writes} redraws): disable "
                            "it on the other processes (disable=not accelerator.is_main_process)")
    if problems:
        what = f"{len(shared)} file(s) written by more than one process" if shared else "output on every process"
        return Verdict(name, FAIL, what, tuple(problems))
    written = sorted(writers)
    missing = sorted(set(runs.original.files) - set(writers)) if runs.original is not None else []
    summary = (f"each file written by one process ({len(written)} file(s): {', '.join(written[:4])}"
               f"{', ...' if len(written) > 4 else ''})" if written else "no file written")
    evidence = (f"the original also wrote: {', '.join(missing[:5])} (not reached in the converted run's steps, "
                "or written elsewhere)",) if missing else ()
    outside = sorted(p for p in {*writers, *(runs.original.files if runs.original else ())} if p.startswith("/"))
    if outside:
        evidence += (f"written outside the check's scratch folder, so the runs replaced them: "
                     f"{', '.join(outside[:5])}",)
    output = "; output on the main process only"
    if unedited:
        output = ("; the converted code's output on the main process only (the other ranks printed what the "
                  "original prints on every process too, from code the conversion cannot gate)")
        for why, texts in unedited.items():
            where = f"from {why}" if why.endswith(".py") else why
            evidence += (f"{len(texts)} line(s) printed on the other ranks {where}, as the original prints them on "
                         f"every process (e.g. {texts[0][:80]!r}): not counted",)
    return Verdict(name, PASS, summary + output, evidence)
