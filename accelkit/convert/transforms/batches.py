"""Hand-made batches (no DataLoader): shard the data by process index, or seed random batches per process.

A training step whose batches do not come from a DataLoader gets them from tensors the script holds: sliced in a
loop (`x[i:i + bs]`), split into a list of batches, fed whole (full-batch training), or sampled at random
(`ix = torch.randint(len(data) - block, (bs,))`, a `get_batch` helper). prepare() cannot shard those, so:
- sliced / listed / whole data: the tensors are sharded once, before training, into equal shares (every
  num_processes-th sample, the tail of at most num_processes-1 samples dropped so every process takes the same
  number of steps); each process then slices its share exactly as the script did;
- random batches: each process draws its own batches (the global batch grows N times, as with a DataLoader),
  seeded with the script's seed plus the process index right before training, after the model is built.
"""

from __future__ import annotations

import re

import libcst as cst

from accelkit.convert.analysis import Facts, bindings, classify, environment_call, environments, inside_class
from accelkit.convert.batch_sources import custom_source, loaders_handed_in, loop_source_call, unseen_call
from accelkit.convert.context import Context, dotted
from accelkit.convert.data_names import alias_source, assignments_of, computed_from
from accelkit.convert.edits import EditPlan
from accelkit.convert.flow import Flow
from accelkit.convert.transforms.distributed import asks_the_rank

NOISE = {"torch.randn", "torch.rand", "torch.randint", "torch.randn_like", "torch.rand_like", "torch.randint_like",
         "torch.normal", "torch.bernoulli", "torch.multinomial", "torch.randperm", "numpy.random.randn",
         "numpy.random.rand", "numpy.random.normal", "numpy.random.uniform", "random.random", "random.gauss"}
RANDOM_INDEX = {"torch.randint", "numpy.random.randint", "numpy.random.choice", "random.randint", "random.choice",
                "random.sample", "random.choices", "numpy.random.default_rng"}
TO_TENSOR = {"torch.from_numpy", "torch.tensor", "torch.as_tensor", "torch.Tensor", "torch.FloatTensor",
             "torch.LongTensor"}
PERMUTATIONS = {"torch.randperm", "numpy.random.permutation", "torch.arange", "numpy.arange"}
SEEDS = {"torch.manual_seed", "numpy.random.seed", "random.seed", "accelerate.utils.set_seed",
         "transformers.set_seed", "transformers.trainer_utils.set_seed", "lightning.seed_everything",
         "pytorch_lightning.seed_everything"}
LOADER_NAME = re.compile(r"loader|_dl\b|\bdl\b|dataloader", re.I)
WINDOW_NOTE = ("# each process trains on an equal contiguous part of the sequence (prepare() cannot shard hand-made "
               "batches)")
STREAMS_NOTE = ("# each process trains on its own contiguous part of every stream (the rows, the batch its states are "
                "sized for, stay whole)")
SHARD_NOTE = "# each process trains on an equal share of the samples (prepare() cannot shard hand-made batches)"


def apply(ctx: Context, facts: Facts, plan: EditPlan, options: object) -> None:
    flow = Flow(ctx, facts)
    done: set[int] = set()
    for backward in flow.backward_calls:
        loop = _batch_loop(ctx, flow, backward)
        if loop is None or id(loop) in done:
            continue
        if _fed_by_loader(ctx, facts, loop):
            done.add(id(loop))
            _report_custom_source_of_a_loader(ctx, facts, plan, loop)
            noise = _random_draws(ctx, facts, flow, loop, NOISE)
            if noise:  # a GAN's latent noise, random masks: the same on every process unless seeded apart
                _seed_per_process(ctx, facts, flow, plan, loop, noise[0], "noise tensors")
            continue
        done.add(id(loop))
        step = _closure_step(ctx, backward)
        _convert_loop(ctx, facts, flow, plan, loop, (step, ctx.function(backward)) if step is not None else None)


def _reached(flow: Flow, loop: cst.CSTNode, depth: int = 3) -> list[cst.FunctionDef]:
    """The script's functions the loop calls, and those they call (a generator of batches calling `make_batch`)."""
    found: list[cst.FunctionDef] = []
    frontier: list[cst.CSTNode] = [loop]
    for _ in range(depth):
        frontier = [f for node in frontier for f in flow.callees(node) if f not in found and f is not loop]
        found += [f for f in dict.fromkeys(frontier) if f not in found]
    return found


def _random_draws(ctx: Context, facts: Facts, flow: Flow, loop: cst.CSTNode, kinds: set[str]) -> list[cst.Call]:
    """Calls of `kinds` in the loop and the script's functions it calls, outside model classes (dropout-like
    randomness inside a model is per process already)."""
    return [n for node in [loop, *_reached(flow, loop)] for n in ctx.descendants(node)
            if type(n) is cst.Call and ctx.qnames(n) & kinds and not inside_class(ctx, n, facts.model_classes)]


def _batch_loop(ctx: Context, flow: Flow, backward: cst.Call) -> cst.For | cst.While | None:
    """The loop that runs one training step per iteration (around the backward, or around the call of the
    function that does the backward)."""
    loop = flow.innermost_loop(backward)
    if loop is not None:
        return loop
    function = ctx.function(backward)
    if function is None:
        return None
    for call in ctx.of_type(cst.Call):
        func = call.func
        name = func.value if isinstance(func, cst.Name) else func.attr.value if isinstance(func, cst.Attribute) \
            else None
        # called, or handed over as an LBFGS closure (`optimizer.step(closure)`) that the step calls
        if name == function.name.value or _closure_step(ctx, backward) is call:
            outer = flow.innermost_loop(call)
            if outer is not None:
                return outer
    return None


def _whole_in_closure(ctx: Context, closure: cst.FunctionDef, roots: list[str]) -> list[str]:
    """The data the closure trains on, when it takes them whole (no slice of them in it); [] otherwise."""
    used = {n.value for n in ctx.descendants(closure) if type(n) is cst.Name}
    whole = [r for r in roots if r in used]
    cut = any(isinstance(n, cst.Subscript) and dotted(n.value) in whole for n in ctx.descendants(closure))
    return [] if cut else whole


def _closure_step(ctx: Context, backward: cst.Call) -> cst.Call | None:
    """`optimizer.step(closure)` when the backward runs in `closure` (LBFGS: the step evaluates it several times and
    decides its line search on the loss it returns)."""
    function = ctx.function(backward)
    if function is None:
        return None
    for call in ctx.of_type(cst.Call):
        if isinstance(call.func, cst.Attribute) and call.func.attr.value == "step" and any(
                isinstance(a.value, cst.Name) and a.value.value == function.name.value for a in call.args):
            return call
    return None


def _custom_source(ctx: Context, loop: cst.CSTNode):
    call = loop_source_call(ctx, loop)
    return custom_source(ctx, call) if call is not None else None


def _loader_inside(ctx: Context, facts: Facts, source) -> bool:
    """The iterator class or generator takes its batches from a DataLoader: handed to it (`DeviceBatches(loader)`,
    `batches(train_loader)`), or iterated in its body (a loop over a loader the script made)."""
    def is_loader(value: cst.BaseExpression) -> bool:
        return facts.kind(value) == "loader" or classify(ctx, value, facts.model_classes) == "loader"

    if loaders_handed_in(source.call, is_loader):
        return True
    definition = next((n for n in ctx.of_type(cst.ClassDef, cst.FunctionDef) if n.name.value == source.name), None)
    return definition is not None and any(ctx.contains(definition, known) for known, _ in facts.loader_loops)


def _report_custom_source_of_a_loader(ctx: Context, facts: Facts, plan: EditPlan, loop: cst.CSTNode) -> None:
    source = _custom_source(ctx, loop)
    if source is not None:
        plan.report.found_item("batches", source.name, ctx.line(loop),
                               f"from the {source.kind} `{source.name}` (line {source.line}) over a DataLoader "
                               "of the script, which is prepared: each process gets its own batches")


def _fed_by_loader(ctx: Context, facts: Facts, loop: cst.CSTNode) -> bool:
    """The loop iterates a DataLoader, or takes `next(...)` of an iterator over one; or it runs inside a loop over
    a DataLoader in the same function (`for b_x, b_y in loader: for net, opt in zip(nets, optimizers): ...`).
    An iterator class or generator of the script counts only when its batches come from a DataLoader, whatever
    its name (`train_loader = ShuffledBatches(x, y)` is not one)."""
    source = _custom_source(ctx, loop)
    if source is not None:
        return _loader_inside(ctx, facts, source)
    function = ctx.function(loop)
    for outer in [loop, *(a for a in ctx.ancestors(loop) if isinstance(a, cst.For) and ctx.function(a) is function)]:
        if any(outer is known for known, _ in facts.loader_loops):
            return True
    if isinstance(loop, cst.For) and LOADER_NAME.search(ctx.code(loop.iter)):
        return True
    for node in ctx.descendants(loop):  # `batch = batch_loader.next()`: a wrapper of a DataLoader (makemore)
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and \
                node.func.attr.value in {"next", "__next__"} and LOADER_NAME.search(dotted(node.func.value) or ""):
            return True
    for node in ctx.descendants(loop):
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.func.value in {"next", "iter"} \
                and node.args:
            inner = node.args[0].value
            if isinstance(inner, cst.Call) and isinstance(inner.func, cst.Name) and inner.func.value == "iter" \
                    and inner.args:
                inner = inner.args[0].value
            if facts.kind(inner) == "loader" or "loader" in (dotted(inner) or "").lower():
                return True
            key = dotted(inner)
            if key and _iterator_of_loader(ctx, facts, key):
                return True
    return False


def _iterator_of_loader(ctx: Context, facts: Facts, key: str) -> bool:
    for small in ctx.of_type(cst.Assign):
        for name, value, _ in bindings(small):
            if name == key and isinstance(value, cst.Call) and isinstance(value.func, cst.Name) \
                    and value.func.value == "iter" and value.args and facts.kind(value.args[0].value) == "loader":
                return True
    return False


def _convert_loop(ctx: Context, facts: Facts, flow: Flow, plan: EditPlan, loop: cst.CSTNode,
                  closure: tuple[cst.Call, cst.FunctionDef] | None = None) -> None:
    function = ctx.function(loop)
    if _plays_episodes(ctx, facts, flow, plan, loop):
        return
    random_draws = _random_draws(ctx, facts, flow, loop, RANDOM_INDEX)
    where = f"the training loop at line {ctx.line(loop)}"
    if random_draws:
        _seed_per_process(ctx, facts, flow, plan, loop, random_draws[0])
        plan.report.iteration_based = True
        return
    own = _sharded_by_the_script(ctx, loop)
    if own is not None:
        name, bound = own
        plan.report.found_item("batches", name, ctx.line(loop), f"sharded by the script itself: `{name}` is made "
                                                                f"with the process rank (line {ctx.line(bound)}), "
                                                                "which becomes accelerator.process_index")
        return
    roots = _roots(ctx, facts, flow, loop)
    if function is not None:
        roots, mixed = _one_scope(ctx, function, roots)
        if mixed:
            local, read = mixed
            plan.report.problem(ctx.line(loop), f"{where} trains on `{local}`, a local of `{function.name.value}`, "
                                                f"and on `{read}`, a global it reads: sharding them together there "
                                                f"would make `{read}` a local of `{function.name.value}` "
                                                "(UnboundLocalError)",
                                f"bind `{local}` and `{read}` in the same place (both in `{function.name.value}`, "
                                "or both at module level), or wrap them in a DataLoader")
            plan.report.found_item("batches", ", ".join(roots), ctx.line(loop), "NOT sharded: data bound in two "
                                                                                 "scopes")
            return
    orders = _index_orders(ctx, loop)
    # a permutation of the indices is no noise: each process permutes its own share (made before it, below)
    noise = [n for n in _random_draws(ctx, facts, flow, loop, NOISE) if not any(n is o for o in orders.values())]
    if not roots and noise:  # fresh random inputs every step (`x = torch.randn(bs, d)` in a batch generator)
        _seed_per_process(ctx, facts, flow, plan, loop, noise[0])
        plan.report.iteration_based = True
        return
    if noise:
        _seed_per_process(ctx, facts, flow, plan, loop, noise[0], "noise tensors")
    source = _custom_source(ctx, loop) or _unseen_source(ctx, loop)
    if source is not None and not (source.kind == "generator function" and roots):
        plan.report.problem(ctx.line(loop), f"{where} takes its batches from {source.describe()}: prepare() "
                                            "cannot shard it, so every process would train on all of the data",
                            "build the batches with a torch.utils.data.DataLoader in this script (TensorDataset "
                            "for tensors; an iterator class or generator may wrap it, the DataLoader is then "
                            "prepared), or shard the data by accelerator.process_index")
        plan.report.found_item("batches", source.name, ctx.line(loop), f"NOT sharded: {source.short()}")
        return
    if not roots:
        plan.report.problem(ctx.line(loop), f"{where} trains on batches that do not come from a DataLoader and "
                                            "whose source could not be found: every process would train on all "
                                            "of the data",
                            "wrap the data in a torch.utils.data.DataLoader (TensorDataset for tensors) and add it "
                            "to accelerator.prepare(...), or shard it by accelerator.process_index")
        plan.report.found_item("batches", "", ctx.line(loop), "NOT sharded: source not found")
        return
    whole = _whole_in_closure(ctx, closure[1], roots) if closure is not None else []
    if closure is not None and whole:
        # the whole tensors each step, through a closure the optimizer re-evaluates (LBFGS): sharded, each process
        # would decide the line search on its own part's loss and take a different number of evaluations (a hang)
        names = ", ".join(f"`{r}`" for r in whole)
        plan.report.found_item("batches", ", ".join(whole), ctx.line(loop),
                               f"full batch: every step trains on all of {names} through "
                               f"`{ctx.code(closure[0])}`, so it is left whole; every process computes the same "
                               "gradient and line search (correct, no speed-up from more processes)")
        return
    if _fixed_selections(ctx, flow, loop, roots):
        names = ", ".join(f"`{r}`" for r in roots)
        plan.report.found_item("batches", ", ".join(roots), ctx.line(loop),
                               "full batch: every step uses the same fixed selection (a mask or index set: "
                               f"{names}), so it is left whole; every process computes the same gradient (correct, "
                               "no speed-up from more processes)")
        return
    sliced = _sliced(ctx, flow, loop, roots)
    through = _bounds_through(ctx, loop, roots) if sliced else []
    if sliced and (through is None or not _helpers_bounded_by_their_data(ctx, flow, loop)):
        names = ", ".join(f"`{r}`" for r in roots)
        plan.report.problem(ctx.line(loop), f"{where} cuts its batches from {names} with bounds that do not follow "
                                            "the data's length: sharding the data would leave steps without data",
                            "loop over `range(0, len(data), batch_size)`, or shard the batch indices by "
                            "accelerator.process_index (the same number on every process)")
        plan.report.found_item("batches", ", ".join(roots), ctx.line(loop), "NOT sharded: fixed loop bounds")
        return
    across = _cut_along_a_later_dimension(ctx, flow, loop, roots)
    dimension = 0
    samples_along = _sample_dimensions(ctx, flow, loop, roots) if across is not None else {}
    if across is not None and not samples_along:
        dimension, why = _stream_dimension(ctx, flow, loop, roots)
        if why:
            plan.report.problem(ctx.line(loop), f"{where} cuts its batches along a later dimension "
                                                f"(`{ctx.code(across)}`) and {why}: the rows are the batch, so "
                                                "sharding them would change the batch size the script builds its "
                                                "states for (a crash or a different model)",
                                "cut the sequence into per-process parts along that dimension (e.g. "
                                "`ids = ids[:, part]`), or wrap the windows in a DataLoader")
            plan.report.found_item("batches", ", ".join(roots), ctx.line(loop), "NOT sharded: cut along a later "
                                                                                 "dimension")
            return
    block, anchor, position = _shard_site(ctx, facts, flow, loop, function, roots)
    if block is None:
        names = ", ".join(f"`{r}`" for r in roots)
        plan.report.problem(ctx.line(loop), f"{where} slices {names}, bound at module level while the "
                                            "Accelerator lives in a function: not sharded",
                            f"shard {names} by accelerator.process_index before training")
        plan.report.found_item("batches", ", ".join(roots), ctx.line(loop), "NOT sharded: data bound at module "
                                                                             "level")
        return
    stale = _computed_before_the_shard(ctx, through or [], block, anchor, position)
    if stale is not None:
        plan.report.problem(ctx.line(loop), f"{where} takes its bounds from `{ctx.code(stale).strip()}` (line "
                                            f"{ctx.line(stale)}), computed before the data it cuts are all bound: "
                                            "after the shard it would still count all of the samples and run past "
                                            "each process's share",
                            "compute it after the data are built (or use `len(data)` in the loop), or wrap the "
                            "data in a DataLoader")
        plan.report.found_item("batches", ", ".join(roots), ctx.line(loop), "NOT sharded: loop bound computed "
                                                                             "before the data")
        return
    late = _orders_that_do_not_follow(ctx, loop, orders, roots, anchor, block, position)
    if late:
        name, call = late
        plan.report.problem(ctx.line(loop), f"{where} indexes its batches by `{name}` (`{ctx.code(call)}`, line "
                                            f"{ctx.line(call)}), an order of the samples whose length does not follow "
                                            "the sharded data: each process's indices would run past its share",
                            f"make `{name}` from the data's length (`torch.randperm(len(data))`) after the data is "
                            "built, or wrap the data in a DataLoader")
        plan.report.found_item("batches", ", ".join(roots), ctx.line(loop), f"NOT sharded: index order `{name}` "
                                                                             "of fixed length")
        return
    # a second loop over the same data, bound in the same place (slices in order, then a shuffled pass): sharded once
    site = (id(block), id(anchor) if position == "after" else 0)
    done_before = [plan.sharded[(*site, r)] for r in roots if (*site, r) in plan.sharded]
    if len(done_before) == len(roots):
        plan.report.found_item("batches", ", ".join(roots), ctx.line(loop), f"sharded by process index before "
                                                                            f"training (line {done_before[0]})")
        return
    roots = [r for r in roots if (*site, r) not in plan.sharded]
    first = next((r for r in roots if not samples_along.get(r)), roots[0])  # its samples along dimension 0
    windows = _windows(ctx, flow, loop)
    if dimension:
        _shard_streams(ctx, plan, loop, roots, dimension, anchor, block, position)
        return
    if windows:
        shard = cst.parse_statement(
            f"shard = slice(accelerator.process_index * (len({first}) // accelerator.num_processes),\n"
            f"              (accelerator.process_index + 1) * (len({first}) // accelerator.num_processes))\n")
        note = WINDOW_NOTE
    else:
        shard = cst.parse_statement(
            f"shard = slice(accelerator.process_index, len({first}) - len({first}) % accelerator.num_processes, "
            "accelerator.num_processes)\n")
        note = SHARD_NOTE
    shard = shard.with_changes(leading_lines=[cst.EmptyLine(comment=cst.Comment(note))])
    targets = ", ".join(roots)
    values = ", ".join(f"{r}[{':, ' * samples_along.get(r, 0)}shard]" for r in roots)
    apply_shard = cst.parse_statement(f"{targets} = {values}\n")
    _insert_shard(plan, block, anchor, position, [shard, apply_shard])
    line = ctx.line(anchor)
    plan.sharded.update({(*site, r): line for r in roots})
    how = ("one contiguous part of len // num_processes rows per process: the batches are windows of a sequence"
           if windows else "every num_processes-th sample, at most num_processes-1 dropped")
    plan.report.change(line, f"shard the hand-made batches' data by process: `{targets} = {values}` ({how})",
                       "prepare() only shards DataLoaders; without this every process trains on all of the data "
                       "(and equal shares keep every process at the same number of steps)")
    plan.report.found_item("batches", targets, ctx.line(loop), f"sharded by process index before training "
                                                                f"(line {line})")


def _one_scope(ctx: Context, function: cst.FunctionDef, roots: list[str]) -> tuple[list[str], tuple[str, str] | None]:
    """The data as names of one scope: a local of the training function that only aliases a global it reads
    (`inputs = dataset_tensor` beside a global `labels`) stands for that global, so that all are sharded where
    they are bound. Returns the roots and, when a local and a global are still mixed, (local, global)."""
    params = {p.name.value for p in function.params.params}

    def local(name: str) -> bool:
        return name in params or bool(assignments_of(ctx, function, name))

    if all(local(r) for r in roots) or not any(local(r) for r in roots):
        return roots, None
    resolved: list[str] = []
    for root in roots:
        source = alias_source(ctx, function, root, function) if local(root) and root not in params else None
        name = source if source is not None and not local(source) else root
        if name not in resolved:
            resolved.append(name)
    still = [r for r in resolved if local(r)]
    if still:
        return roots, (still[0], next(r for r in resolved if not local(r)))
    return resolved, None


def _plays_episodes(ctx: Context, facts: Facts, flow: Flow, plan: EditPlan, loop: cst.CSTNode) -> bool:
    """Reinforcement learning: the loop's data are episodes of an environment (`state, reward, ... =
    env.step(action)`, REINFORCE, actor-critic). There is nothing to shard: each process plays its own episodes
    (its torch, numpy and `random` streams, and the environment's, seeded apart) and the gradient is averaged over
    the N processes' episodes, as a DataLoader's global batch grows N times."""
    envs = environments(ctx, facts.model_classes)
    step = None
    for node in [loop, *_reached(flow, loop)] if envs else []:
        step = environment_call(ctx, node, envs)
        if step is not None:
            break
    if step is None:
        return False
    env = dotted(step.func.value)  # type: ignore[attr-defined]
    resets = [c for c in ctx.of_type(cst.Call) if ctx.line(c) < ctx.line(loop) and isinstance(c.func, cst.Attribute)
              and c.func.attr.value == "reset" and dotted(c.func.value) == env]  # `env.reset(seed=args.seed)`
    reseed = [f"{ctx.code(c.func)}(seed={ctx.code(a.value)} + accelerator.process_index)"
              for c in resets for a in c.args if a.keyword is not None and a.keyword.value == "seed"][-1:]
    _seed_per_process(ctx, facts, flow, plan, loop, step, "episodes", reseed)
    plan.report.found_item("batches", env, ctx.line(loop),
                           f"episodes of the environment `{env}` (`{ctx.code(step)}`, line {ctx.line(step)}): each "
                           "process plays its own and the gradient is averaged over the N processes' episodes; "
                           "progress is counted in steps")
    plan.report.iteration_based = True
    return True


def _insert_shard(plan: EditPlan, block, anchor: cst.CSTNode, position: str, statements: list) -> None:
    """The shard statements go before the anchor, at the start of its block, or after it (`_shard_site`)."""
    if position == "start":
        plan.body_start[block].extend(statements)
        plan.accelerator_uses.append(anchor)
        return
    for statement in statements:
        (plan.insert_before if position == "before" else plan.insert_after)(anchor, statement)


def _sharded_by_the_script(ctx: Context, loop: cst.CSTNode) -> tuple[str, cst.CSTNode] | None:
    """The object the loop takes its batches from (`x, y = train_loader.next_batch()`) when the script builds it
    with the process rank (`DataLoaderLite(..., process_rank=ddp_rank, num_processes=ddp_world_size)`): each
    process already reads its own part, so sharding its data again would leave each a fraction of its share."""
    owners = {dotted(c.func.value) for c in ctx.descendants(loop)  # type: ignore[attr-defined]
              if type(c) is cst.Call and isinstance(c.func, cst.Attribute)}  # type: ignore[attr-defined]
    owners.discard(None)
    if not owners:
        return None
    bound: dict[str, list[tuple[cst.BaseExpression, cst.Assign]]] = {}
    for a in ctx.of_type(cst.Assign):
        for key, value, _ in bindings(a):
            if value is not None:
                bound.setdefault(key, []).append((value, a))  # type: ignore[arg-type]

    def rank(arg: cst.BaseExpression) -> bool:
        if isinstance(arg, cst.Name):
            return any(asks_the_rank(ctx, value) for value, _ in bound.get(arg.value, []))
        return asks_the_rank(ctx, arg)

    for owner in sorted(owners):
        for value, assign in bound.get(owner, []):
            if isinstance(value, cst.Call) and any(rank(a.value) for a in value.args):
                return owner, assign
    return None


def _roots(ctx: Context, facts: Facts, flow: Flow, loop: cst.CSTNode) -> list[str]:
    """Names of the data the loop's batches are cut from: bound outside the loop, sliced or indexed in it (or in
    the script's functions it calls), converted to tensors in it, or iterated by it as a list of batches."""
    bound_inside = {k for n in ctx.descendants(loop) if isinstance(n, (cst.Assign, cst.AnnAssign, cst.AugAssign))
                    for k, _, _ in bindings(n)}
    if isinstance(loop, cst.For):
        bound_inside |= {n.value for n in ctx.descendants(loop.target) if type(n) is cst.Name}
    skip = set(facts.kinds) | facts.device_names | set(_index_orders(ctx, loop))  # indices into the data, not data
    models = facts.of_kind("model")
    found: list[str] = []

    scope = ctx.function(loop) or ctx.module

    def add(name: str | None, depth: int = 3) -> None:
        if not name:
            return
        if name in bound_inside:  # `data, target = train_x, train_y` in the loop: the data are what it aliases
            if depth:
                add(alias_source(ctx, scope, name, loop), depth - 1)
        elif name not in skip and name not in found and name.isidentifier():
            found.append(name)

    for node in [loop, *_reached(flow, loop)]:
        params = set()
        if isinstance(node, cst.FunctionDef):  # a helper's parameters and its own locals are no data sources
            params = {p.name.value for p in node.params.params}
            params |= {k for n in ctx.descendants(node) if isinstance(n, (cst.Assign, cst.AnnAssign))
                       for k, _, _ in bindings(n)}
        for n in ctx.descendants(node):
            if isinstance(n, cst.Subscript) and isinstance(n.value, cst.Name) and n.value.value not in params:
                if any(isinstance(e.slice, cst.Index) and isinstance(e.slice.value, (cst.Integer,
                                                                                     cst.SimpleString))
                       for e in n.slice):
                    continue  # `cfg["lr"]`, `shape[0]`: not a batch cut from data
                add(n.value.value)
            elif isinstance(n, cst.Call) and ctx.qnames(n) & TO_TENSOR and n.args and \
                    isinstance(n.args[0].value, cst.Name) and n.args[0].value.value not in params:
                add(n.args[0].value.value)  # not a helper's own list (`returns = torch.tensor(returns)`)
            elif isinstance(n, cst.Call) and dotted(n.func) in models and not _evaluated_aside(ctx, flow, n, loop):
                # full batch: `model(x)`
                # and the targets beside it in the same statement: `loss = criterion(model(x), y)`
                statement = ctx.small_statement(n) or n
                for call in [n, *ctx.descendants(statement)]:
                    if type(call) is not cst.Call or dotted(call.func) in models and call is not n:
                        continue
                    for arg in call.args:  # type: ignore[attr-defined]
                        if isinstance(arg.value, cst.Name) and arg.value.value not in params:
                            add(arg.value.value)
                # or in the statement that takes the output: `out = net(x)` then `loss = loss_func(out, y)`
                outputs = {k for k, _, _ in bindings(statement)} if isinstance(statement, cst.Assign) else set()
                for call in (c for c in ctx.descendants(node) if type(c) is cst.Call and outputs and
                             any(isinstance(a.value, cst.Name) and a.value.value in outputs
                                 for a in c.args)):  # type: ignore[attr-defined]
                    for arg in call.args:  # type: ignore[attr-defined]
                        if isinstance(arg.value, cst.Name) and arg.value.value not in params | outputs:
                            add(arg.value.value)
    for name in _handed_to_slicing_helpers(ctx, flow, loop):  # `get_batch(train_data, i)`
        add(name)
    if not found and isinstance(loop, cst.For):
        source = loop.iter
        if isinstance(source, cst.Call) and ctx.code(source.func) in {"enumerate", "tqdm", "tqdm.tqdm"} \
                and source.args:
            source = source.args[0].value
        if isinstance(source, cst.Call) and isinstance(source.func, cst.Name) and source.func.value == "zip":
            for arg in source.args:
                inner = arg.value
                if isinstance(inner, cst.Call) and isinstance(inner.func, cst.Attribute) and \
                        inner.func.attr.value in {"split", "chunk"}:
                    add(dotted(inner.func.value))
        elif isinstance(source, cst.Name) and _bound_to_a_list(ctx, loop, source.value):
            add(source.value)
    return [r for r in found if _looks_like_data(ctx, loop, r)]


def _index_orders(ctx: Context, loop: cst.CSTNode) -> dict[str, cst.Call]:
    """Names bound to an order of the samples' indices (`order = torch.randperm(len(x))`, `idx = np.arange(n)`,
    `idx = list(range(len(x)))` then shuffled) in the loop's function: they index the data, they are not data."""
    found: dict[str, cst.Call] = {}
    for node in ctx.descendants(ctx.function(loop) or ctx.module):
        if isinstance(node, cst.Assign):
            for key, value, position in bindings(node):
                if position is not None or not isinstance(value, cst.Call):
                    continue
                if ctx.code(value.func) == "list" and value.args and isinstance(value.args[0].value, cst.Call) \
                        and ctx.code(value.args[0].value.func) == "range":
                    found[key] = value.args[0].value
                elif ctx.qnames(value) & PERMUTATIONS:
                    found[key] = value
    return found


def _orders_that_do_not_follow(ctx: Context, loop: cst.CSTNode, orders: dict[str, cst.Call], roots: list[str],
                               anchor: cst.CSTNode, block, position: str) -> tuple[str, cst.Call] | None:
    """An index order the loop uses that would not be made over the shard: its length reads none of the data
    (directly, `torch.randperm(len(x))`, or through a local, `n = len(x)`), or it is made before the data are
    sharded (`anchor`)."""
    used = {n.value for n in ctx.descendants(loop) if type(n) is cst.Name}
    scope = ctx.function(loop) or ctx.module
    for name, call in orders.items():
        if name not in used:
            continue
        through = computed_from(ctx, scope, call, set(roots))
        if through is None or ctx.line(call) <= ctx.line(anchor) or \
                _computed_before_the_shard(ctx, through, block, anchor, position) is not None:
            return name, call
    return None


def _evaluated_aside(ctx: Context, flow: Flow, call: cst.Call, loop: cst.CSTNode) -> bool:
    """`if t % 10 == 0: test_pred = net(test_x)` in the training loop: a forward under an `if` that does not train,
    whose outputs reach no backward pass, evaluates held-out data; that data stays whole on every process
    (MorvanZhou's 503_dropout.py: the test set was sharded with the training data)."""
    guard = None
    for ancestor in ctx.ancestors(call):
        if ancestor is loop:
            break
        if isinstance(ancestor, cst.If) and not flow.trains(ancestor):
            guard = ancestor
            break
    if guard is None:
        return False
    statement = ctx.small_statement(call)
    reached = {k for k, _, _ in bindings(statement)} if isinstance(statement, (cst.Assign, cst.AnnAssign)) else set()
    if not reached:
        return True  # used in place (`plt.plot(x, net(x))`)
    scope = ctx.function(call) or ctx.module
    assigns = [(set(k for k, _, _ in bindings(a)), {n.value for n in ctx.descendants(a.value) if type(n) is cst.Name})
               for a in ctx.descendants(scope) if isinstance(a, (cst.Assign, cst.AugAssign)) and a.value is not None
               and not isinstance(a, cst.AugAssign)]
    for _ in range(4):
        for targets, reads in assigns:
            if reads & reached:
                reached |= targets
    for backward in flow.backward_calls:
        owner = backward.func.value  # type: ignore[attr-defined]
        names = {n.value for n in ctx.descendants(owner) if type(n) is cst.Name}
        names |= {n.value for a in backward.args for n in ctx.descendants(a.value) if type(n) is cst.Name}
        if names & reached:
            return False
    return True


def _handed_to_slicing_helpers(ctx: Context, flow: Flow, loop: cst.CSTNode) -> list[str]:
    """Names the loop hands to the script's own functions that cut batches from that parameter
    (`data, targets = get_batch(train_data, i)` with `def get_batch(source, i): ... source[i:i + n]`)."""
    return [arg for _, function, param, arg in _handed_parameters(ctx, flow, loop)
            if any(isinstance(n, cst.Subscript) and isinstance(n.value, cst.Name) and n.value.value == param
                   for n in ctx.descendants(function.body))]


def _windows(ctx: Context, flow: Flow, loop: cst.CSTNode) -> bool:
    """Batches are windows of a sequence: one name sliced from two different starts (`source[i:i + n]` and the
    next-token targets `source[i + 1:i + 1 + n]`). Such data is sharded in contiguous chunks (a strided shard
    would interleave the sequence)."""
    starts: dict[str, set[str]] = {}
    for node in [loop, *_reached(flow, loop)]:
        for n in ctx.descendants(node):
            if not (isinstance(n, cst.Subscript) and isinstance(n.value, cst.Name)):
                continue
            for element in n.slice:
                if isinstance(element.slice, cst.Slice) and element.slice.lower is not None:
                    starts.setdefault(n.value.value, set()).add(ctx.code(element.slice.lower).replace(" ", ""))
    return any(len(found) > 1 for found in starts.values())


def _unseen_source(ctx: Context, loop: cst.CSTNode):
    """The loop iterates the result of a call into code the converter cannot read (`make_batches(...)` of another
    module), and no loader-like name or use makes it a DataLoader."""
    call = loop_source_call(ctx, loop)
    return unseen_call(ctx, call) if call is not None else None


def _bound_to_a_list(ctx: Context, loop: cst.CSTNode, name: str) -> bool:
    """`batches = [...]`, `batches = make_batches(...)`, `list(zip(...))`: a list of batches the script made (a
    parameter or anything else could be a DataLoader handed in)."""
    function = ctx.function(loop)
    scope = function if function is not None else ctx.module
    for node in ctx.descendants(scope):
        if isinstance(node, cst.Assign):
            for key, value, position in bindings(node):
                if key == name and position is None and isinstance(value, (cst.List, cst.ListComp, cst.Call)):
                    if isinstance(value, cst.Call) and (custom_source(ctx, value) or unseen_call(ctx, value)):
                        return False  # an iterator, a generator, or what code it cannot read returns
                    return not (isinstance(value, cst.Call) and "DataLoader" in ctx.code(value.func))
    return False


def _sliced(ctx: Context, flow: Flow, loop: cst.CSTNode, roots: list[str]) -> bool:
    """The batches are cut from the data by index (`x[i:i + bs]`), not fed whole."""
    return any(isinstance(n, cst.Subscript) and isinstance(n.value, cst.Name) and n.value.value in roots
               for node in [loop, *_reached(flow, loop)] for n in ctx.descendants(node))


def _cut_along_a_later_dimension(ctx: Context, flow: Flow, loop: cst.CSTNode, roots: list[str]):
    """`ids[:, i:i + n]`: the data's first dimension is kept whole and the windows run along the next one (in the
    loop, or in a helper of the script the data is handed to: `get_batch(ids, i)` cutting `source[:, i:i + n]`)."""
    for n in _cuts(ctx, flow, loop, roots):
        if len(n.slice) > 1 and isinstance(n.slice[0].slice, cst.Slice) and \
                n.slice[0].slice.lower is None and n.slice[0].slice.upper is None and \
                any(isinstance(e.slice, cst.Slice) and e.slice.lower is not None for e in n.slice[1:]):
            return n
    return None


def _cuts(ctx: Context, flow: Flow, loop: cst.CSTNode, roots: list[str]) -> list[cst.Subscript]:
    """Every subscript of the data in the loop, and of the parameters of the script's functions the loop hands
    the data to (`get_batch(ids, i)` cutting `source[:, i:i + n]`)."""
    handed: dict[int, set[str]] = {}
    for _, function, param, arg in _handed_parameters(ctx, flow, loop):
        if arg in roots:
            handed.setdefault(id(function), set()).add(param)
    cuts = [n for n in ctx.descendants(loop) if isinstance(n, cst.Subscript) and isinstance(n.value, cst.Name)
            and n.value.value in roots]
    for function in _reached(flow, loop):
        params = {p.name.value for p in function.params.params}
        names = handed.get(id(function), set()) | (set(roots) - params)  # its parameters, or the data as a global
        cuts += [n for n in ctx.descendants(function.body) if isinstance(n, cst.Subscript)
                 and isinstance(n.value, cst.Name) and n.value.value in names]
    return cuts


def _handed_parameters(ctx: Context, flow: Flow, loop: cst.CSTNode):
    """(call, function, parameter, argument name) for each plain name the loop hands to the script's functions."""
    for call in ctx.descendants(loop):
        if type(call) is not cst.Call or not isinstance(call.func, cst.Name):  # type: ignore[attr-defined]
            continue
        for function in flow.functions.get(call.func.value, []):  # type: ignore[attr-defined]
            params = [p.name.value for p in function.params.params]
            for position, arg in enumerate(call.args):  # type: ignore[attr-defined]
                param = arg.keyword.value if arg.keyword is not None else \
                    params[position] if position < len(params) else None
                if param and isinstance(arg.value, cst.Name):
                    yield call, function, param, arg.value.value


def _stream_dimension(ctx: Context, flow: Flow, loop: cst.CSTNode, roots: list[str]) -> tuple[int, str]:
    """The dimension d > 0 along which the loop steps through parallel streams (`ids[:, i:i + n]` and the next-token
    targets `ids[:, i + 1:i + 1 + n]`: B rows, each a contiguous stream, windows along dim 1), with a loop bounded
    by that dimension's length (`range(0, ids.size(1) - n, n)`). Returns (d, "") when proven, (0, why not) else.
    Each process can then take its own contiguous part of every stream: the rows (the batch the hidden states
    are sized for) stay whole, the streams are N times shorter."""
    dimensions: set[int] = set()
    starts: dict[str, set[str]] = {}  # per name cut: the windows' starts
    for cut in _cuts(ctx, flow, loop, roots):
        elements = list(cut.slice)
        whole = 0
        while whole < len(elements) and isinstance(elements[whole].slice, cst.Slice) and \
                elements[whole].slice.lower is None and elements[whole].slice.upper is None:
            whole += 1
        window = elements[whole].slice if whole < len(elements) else None
        if not isinstance(window, cst.Slice) or window.lower is None or window.upper is None:
            return 0, f"also cuts it otherwise (`{ctx.code(cut)}`), so what its dimensions hold is not known"
        dimensions.add(whole)
        starts.setdefault(cut.value.value, set()).add(  # type: ignore[attr-defined]
            ctx.code(window.lower).replace(" ", "").replace("(", "").replace(")", ""))
    if len(dimensions) != 1 or 0 in dimensions:
        return 0, "cuts it along more than one dimension"
    dimension = dimensions.pop()
    if not any(len(found) > 1 for found in starts.values()):
        return 0, (f"takes one window per step along dimension {dimension} (no next-token targets cut from the "
                   "same data), so that dimension is not known to be a sequence")
    if not _bounded_along(ctx, loop, roots, dimension):
        return 0, f"its loop bounds do not follow the length of dimension {dimension} (`.size({dimension})`)"
    return dimension, ""


def _sample_dimensions(ctx: Context, flow: Flow, loop: cst.CSTNode, roots: list[str]) -> dict[str, int]:
    """Batch-second data (`trX[:, start:end, :]` of (time, samples, features) beside the labels `trY[start:end]`):
    every cut takes the same one window per step, along dimension 0 of some data and a later one of others, and
    the loop is bounded by the length of the data cut along dimension 0 (`len(trY)`, or a name computed from it).
    The window pairs each sample of the later dimension with a label, so that dimension holds the samples: each
    datum's dimension is returned ({} when not proven)."""
    along: dict[str, int] = {}
    windows: set[str] = set()
    for cut in _cuts(ctx, flow, loop, roots):
        elements = [e.slice for e in cut.slice]
        whole = [isinstance(e, cst.Slice) and e.lower is None and e.upper is None and e.step is None
                 for e in elements]
        cuts = [i for i, w in enumerate(whole) if not w]
        if len(cuts) != 1 or not isinstance(elements[cuts[0]], cst.Slice):
            return {}
        window = elements[cuts[0]]
        if window.lower is None or window.upper is None or window.step is not None:
            return {}
        name = cut.value.value  # type: ignore[attr-defined]
        if along.setdefault(name, cuts[0]) != cuts[0]:
            return {}
        windows.add(f"{ctx.code(window.lower)}:{ctx.code(window.upper)}".replace(" ", ""))
    first = [r for r, d in along.items() if d == 0]
    if len(windows) != 1 or not first or len(first) == len(along) or set(along) != set(roots):
        return {}
    return along if _bounds_through(ctx, loop, first) is not None else {}


def _bounded_along(ctx: Context, loop: cst.CSTNode, roots: list[str], dimension: int) -> bool:
    """`for i in range(0, ids.size(1) - n, n)`: the loop's bounds read the windowed dimension's length."""
    if not isinstance(loop, cst.For):
        return False
    source = loop.iter
    if isinstance(source, cst.Call) and ctx.code(source.func) == "enumerate" and source.args:
        source = source.args[0].value
    if not (isinstance(source, cst.Call) and ctx.code(source.func) == "range"):
        return False
    wanted = {f"{r}.size({dimension})" for r in roots} | {f"{r}.shape[{dimension}]" for r in roots}
    return any(ctx.code(n).replace(" ", "") in wanted for n in ctx.descendants(source)
               if isinstance(n, (cst.Call, cst.Subscript)))


def _shard_streams(ctx: Context, plan: EditPlan, loop: cst.CSTNode, roots: list[str], dimension: int,
                   anchor: cst.CSTNode, block: cst.CSTNode, position: str) -> None:
    """Give each process its own contiguous part of every stream along `dimension`: N*B streams in all, B per
    process, so the per-process batch (and every state sized by it) stays as the script wrote it."""
    first = roots[0]
    length = f"{first}.shape[{dimension}]"
    shard = cst.parse_statement(
        f"shard = slice(accelerator.process_index * ({length} // accelerator.num_processes),\n"
        f"              (accelerator.process_index + 1) * ({length} // accelerator.num_processes))\n")
    shard = shard.with_changes(leading_lines=[cst.EmptyLine(comment=cst.Comment(STREAMS_NOTE))])
    lead = ":, " * dimension
    targets = ", ".join(roots)
    values = ", ".join(f"{r}[{lead}shard]" for r in roots)
    apply_shard = cst.parse_statement(f"{targets} = {values}\n")
    _insert_shard(plan, block, anchor, position, [shard, apply_shard])
    line = ctx.line(anchor)
    plan.sharded.update({(id(block), id(anchor) if position == "after" else 0, r): line for r in roots})
    plan.report.change(line, f"shard the parallel streams by process: `{targets} = {values}` (each process takes "
                             f"its own contiguous part of every stream along dimension {dimension}; the rows, the "
                             "batch, stay whole)",
                       "prepare() only shards DataLoaders; the loop steps through B parallel streams in time, and "
                       "states sized by B (an RNN's hidden state) need B rows on every process: the same number of "
                       "steps on each, every token trained on by one process")
    plan.report.found_item("batches", targets, ctx.line(loop), f"parallel streams along dimension {dimension}: "
                                                                f"sharded in time by process (line {line})")


def _fixed_selections(ctx: Context, flow: Flow, loop: cst.CSTNode, roots: list[str]) -> bool:
    """Every cut of the data is the same on every step: `labels[idx_train]`, `x[mask]` with an index that nothing
    in the loop changes (full-batch training on a graph, a fixed train split), never `x[i:i + bs]`."""
    changing = {k for n in ctx.descendants(loop) if isinstance(n, (cst.Assign, cst.AnnAssign, cst.AugAssign))
                for k, _, _ in bindings(n)}
    if isinstance(loop, cst.For):
        changing |= {n.value for n in ctx.descendants(loop.target) if type(n) is cst.Name}
    cuts = [n for n in ctx.descendants(loop)
            if isinstance(n, cst.Subscript) and isinstance(n.value, cst.Name) and n.value.value in roots]
    for function in _reached(flow, loop):  # the data handed to a helper is cut there under its parameter name
        params = {p.name.value for p in function.params.params} - {"self"}
        changing |= {k for n in ctx.descendants(function.body) if isinstance(n, (cst.Assign, cst.AnnAssign,
                                                                                   cst.AugAssign))
                     for k, _, _ in bindings(n)}
        cuts += [n for n in ctx.descendants(function.body)
                 if isinstance(n, cst.Subscript) and isinstance(n.value, cst.Name) and n.value.value in params]
    if not cuts:
        return False
    for cut in cuts:
        for element in cut.slice:
            index = element.slice
            if not isinstance(index, cst.Index):
                return False  # a slice `a:b`
            names = {n.value for n in ctx.descendants(index.value) if type(n) is cst.Name}
            if not names or names & changing:
                return False
    return True


def _bounds_through(ctx: Context, loop: cst.CSTNode, roots: list[str]) -> list[cst.CSTNode] | None:
    """A loop over `range(...)` must take its bounds from the data, so that it follows the shard: `len(x)` itself
    (returns []), or a local computed from it (`n = len(x)`, `steps = x.size(0) // bs`: returns the assignments it
    goes through, which must run after the shard). None when the bounds do not follow the data."""
    scope = ctx.function(loop) or ctx.module
    if isinstance(loop, cst.While):
        if not any(isinstance(n, cst.Subscript) for n in ctx.descendants(loop)):
            return []
        return computed_from(ctx, scope, loop.test, set(roots))
    source = loop.iter  # type: ignore[attr-defined]
    if isinstance(source, cst.Call) and ctx.code(source.func) == "enumerate" and source.args:
        source = source.args[0].value
    if not (isinstance(source, cst.Call) and ctx.code(source.func) == "range"):
        return []
    return computed_from(ctx, scope, source, set(roots))


def _computed_before_the_shard(ctx: Context, through: list[cst.CSTNode], block, anchor: cst.CSTNode,
                               position: str) -> cst.CSTNode | None:
    """The first assignment a loop bound or an index order goes through that runs before the data are sharded
    after `anchor` (`n = len(x)` between `x = ...` and `y = ...`: it would keep the length of all the data)."""
    if position != "after":
        return None
    body = list(block.body)
    for statement in through:
        top = ctx.top_statement_in(statement, block)
        if top is not None and body.index(top) <= body.index(anchor):
            return statement
    return None


def _helpers_bounded_by_their_data(ctx: Context, flow: Flow, loop: cst.CSTNode) -> bool:
    """A generator or helper of the script that cuts the data it is handed in a `range(...)` loop takes the bounds
    from that data (`range(0, len(x), size)`, or a local made from it), never a fixed count (`range(0, 128, size)`
    would run past each process's share: empty batches)."""
    for function in _reached(flow, loop):
        params = {p.name.value for p in function.params.params} - {"self"}
        local = {k for n in ctx.descendants(function.body) if isinstance(n, (cst.Assign, cst.AnnAssign))
                 for k, _, _ in bindings(n)}
        for inner in (n for n in ctx.descendants(function.body) if isinstance(n, cst.For)):
            source = inner.iter
            if isinstance(source, cst.Call) and ctx.code(source.func) == "enumerate" and source.args:
                source = source.args[0].value
            if not (isinstance(source, cst.Call) and ctx.code(source.func) == "range"):
                continue
            cuts = any(isinstance(n, cst.Subscript) and isinstance(n.value, cst.Name) and n.value.value in params
                       for n in ctx.descendants(inner.body))
            stop = source.args[1 if len(source.args) > 1 else 0].value if source.args else source
            bounds = {n.value for n in [stop, *ctx.descendants(stop)] if type(n) is cst.Name}
            if cuts and not bounds & (params | local):
                return False
    return True


def _looks_like_data(ctx: Context, loop: cst.CSTNode, name: str) -> bool:
    """Bound (before the loop) by something that makes data, not a number, a string or a config."""
    function = ctx.function(loop)
    scope = function if function is not None else ctx.module
    for node in ctx.descendants(scope):
        if isinstance(node, (cst.Assign, cst.AnnAssign)):
            for key, value, _ in bindings(node):
                if key == name and value is not None and isinstance(value, (cst.Integer, cst.Float,
                                                                            cst.SimpleString, cst.Dict)):
                    return False
    return True


def _shard_site(ctx: Context, facts: Facts, flow: Flow, loop: cst.CSTNode, function: cst.FunctionDef | None,
                roots: list[str]):
    """Where the shard goes: after the last binding of the data in the loop's function (or module), before the
    statement of that block that contains the training loop; at the function's start for parameters."""
    scope = ctx.scope_body(loop)
    body = list(scope.body)  # type: ignore[attr-defined]
    top = ctx.top_statement_in(loop, scope)  # type: ignore[arg-type]
    if top is None:
        return None, None, None
    limit = body.index(top)
    last = -1
    for i, line in enumerate(body[:limit]):
        if isinstance(line, (cst.FunctionDef, cst.ClassDef)):
            continue  # a local of a function defined here is not the block's data
        for node in ctx.descendants(line):
            if isinstance(node, (cst.Assign, cst.AnnAssign)) and any(k in roots for k, _, _ in bindings(node)):
                last = i
    if last >= 0:
        return scope, body[last], "after"
    params = {p.name.value for p in function.params.params} if function is not None else set()
    if function is not None and all(r in params for r in roots):
        return scope, top, "start"
    # globals read by a training function (`train_data = batchify(...)` at module level): sharded where they are
    # bound, when the Accelerator lives at module level too (the script parses its arguments there, or nowhere)
    parse = facts.parse_args
    if function is not None and (parse is None or ctx.function(parse) is None):
        module_body = list(ctx.module.body)
        last = -1
        for i, line in enumerate(module_body):
            if isinstance(line, cst.SimpleStatementLine) and any(
                    k in roots for small in line.body for k, _, _ in bindings(small)):
                last = i
        if last >= 0:
            return ctx.module, module_body[last], "after"
    return None, None, None


def _seed_per_process(ctx: Context, facts: Facts, flow: Flow, plan: EditPlan, loop: cst.CSTNode,
                      draw: cst.Call, what: str = "batches", reseed: list[str] | None = None) -> None:
    """Each process gets its own random stream before training. torch starts every process from the same default
    seed (seeded or not, every rank would draw the same batches or noise); numpy and `random` seed themselves from
    the OS unless the script seeds them."""
    seeds = [c for c in ctx.of_type(cst.Call) if ctx.qnames(c) & SEEDS and c.args and ctx.line(c) < ctx.line(loop)]
    line = ctx.line(draw)
    block = ctx.scope_body(loop)
    top = ctx.top_statement_in(loop, block)  # type: ignore[arg-type]
    if top is None or id(top) in plan.seeded:
        return
    plan.seeded.add(id(top))
    calls: dict[str, str] = {}
    for call in seeds:  # the last seed of each library the script seeds
        calls[ctx.code(call.func)] = ctx.code(call.args[0].value)
    added = [f"{func}({value} + accelerator.process_index)" for func, value in calls.items()]
    seeds_torch = any(ctx.qnames(c) & (SEEDS - {"numpy.random.seed", "random.seed"}) for c in seeds)
    if not seeds_torch and ("torch" in ctx.code(draw.func) or what == "episodes"):  # actions sampled by torch
        added.append("torch.manual_seed(torch.initial_seed() + accelerator.process_index)")
    added += reseed or []  # an environment seeded by the script (`env.reset(seed=args.seed)`)
    if not added:
        plan.report.found_item(what, "", line, f"random {what} drawn per process (the script does not seed its "
                                               "random generator, so each process already draws its own)")
        return
    block_code = "".join(f"    {code}\n" for code in added)
    statement = cst.parse_statement(f"if accelerator.process_index > 0:\n{block_code}")
    statement = statement.with_changes(leading_lines=[cst.EmptyLine(comment=cst.Comment(
        f"# each process draws its own random {what}; process 0 goes on with the script's own random stream"))])
    plan.insert_before(top, statement)
    plan.report.change(ctx.line(top), f"added `{'`, `'.join(added)}` on the other processes before training",
                       f"the {what} are drawn at random (line {line}); every process starts from the same seed and "
                       f"would draw the same ones (duplicated work instead of N times the {what})")
    if what == "batches":
        plan.report.found_item("batches", "", line, "random batches: each process draws its own (seed + process "
                                                    "index before training); progress is counted in steps, not "
                                                    "epochs")
    else:
        plan.report.found_item("random", "", line, f"{what}: drawn per process (seed + process index before "
                                                   "training)")
