"""Training many copies of the paper's transformer at once: the (K, seed) grids behind the thresholds
K1* and K2* (Sec. "Transition between memorization and generalization", Fig. 7) are hundreds of small
models, each too small to fill a GPU on its own.

Two interchangeable "trainers" own the weights and the AdamW state, with one interface used by the ensembles
(runners/grids.train_ensemble, whose loop is train.py's over the members) and by bench/bench_train.py (both take
bf16=True for mixed precision, --bf16):
  Single    one Transformer and its AdamW, an ensemble of one (train.py's single run writes its step itself).
  Ensemble  E Transformers whose weights are stacked along a leading member axis
            (torch.func.stack_module_state); one call of the model per step through
            torch.func.vmap(functional_call(...)), so transformer.py stays the paper's single model.
GraphedStep wraps either in a CUDA graph (AdamW capturable: with_capturable converts a saved AdamW state);
sampled_step draws every member's batch (fastdata.batches) and steps, inside that graph on CUDA; accelerate_run is
train.py's speed block for one run.

Member e of an Ensemble is the single run with the same K and seed: train.py gives it the same initial
weights and the same batches (its own task set and generator), and AdamW is elementwise, so row e of the
stacked AdamW state is exactly member e's own state (same hyper-parameters, same step count). The only
difference is floating-point rounding: batched matmuls may sum in another order than single ones.

On CUDA both trainers run the model with the Triton kernels (fastpath.accelerate; the switch: kernels=None keeps
the plain model). The kernels' autograd.Functions have vmap rules: the members' sequences become more sequences
(or, with a position bias, their heads more heads; kernels/attention.py, _Attention.vmap), their rows more rows
(kernels/layer_norm.py), and their weights and embedding tables a grid axis of the kernel (kernels/mlp.py,
kernels/embedding.py).
"""
import copy
import warnings
from types import SimpleNamespace

import torch
from torch.func import functional_call, stack_module_state, vmap

from engine import fastdata, fastpath
from evaluation import dense_readouts, lm_loss
from markov import TaskSet
from transformer import Transformer


def with_capturable(optimizer_state: dict, capturable: bool) -> dict:
    """An AdamW state_dict with the given capturable flag (True: the step counters on the device, as a CUDA graph's
    capture needs; False: a plain step's). A state_dict carries the flag of the optimizer that wrote it, and
    load_state_dict would restore it, placing the step counters for the wrong kind of step."""
    return {**optimizer_state, "param_groups": [{**g, "capturable": capturable} for g in optimizer_state["param_groups"]]}


def mixed_precision(enabled: bool, device: torch.device):
    """The forward of a training step under torch.autocast(bfloat16) when enabled (--bf16), as train.py's step
    writes it: matmuls, attention (the kernel's bf16 path) and the MLP's hidden activations in bf16; weights,
    gradients, AdamW state, the residual stream, layer norms and the loss stay fp32. The cast cache is off: inside
    a CUDA graph capture a cached cast of a weight would be replayed stale after AdamW changed the weight."""
    return torch.autocast(device.type, torch.bfloat16, enabled=enabled, cache_enabled=False)


# ----------------------------------------------------------------------------- trainers


def on_device(model: Transformer, kernels: fastpath.Kernels | None) -> Transformer:
    """The model as the trainers run it: on CUDA with the kernels of `kernels` (fastpath.accelerate, in place),
    elsewhere or with kernels=None the plain model."""
    on_cuda = next(model.parameters()).is_cuda
    return fastpath.accelerate(model, kernels) if kernels is not None and on_cuda else model


TASKS = "task_embedding.weight"  # task injection's (K, D) table, the one weight whose shape depends on K


def padded_rows(table: torch.Tensor, K: int) -> torch.Tensor:
    """A (k, ...) table with zero rows appended up to K rows."""
    return torch.cat([table, table.new_zeros(K - table.shape[0], *table.shape[1:])]) if table.shape[0] < K else table


def padded_tasks(model: Transformer, K: int) -> Transformer:
    """The model with its task table padded to K rows (a copy), or the model itself when nothing is padded."""
    if model.task_embedding is None or model.task_embedding.num_embeddings == K:
        return model
    model = copy.deepcopy(model)
    weight = model.task_embedding.weight
    model.task_embedding = torch.nn.Embedding.from_pretrained(padded_rows(weight.detach(), K), freeze=False)
    return model


class Single:
    """One model and its AdamW. Batches come as (1, B, N + 1), losses go out as (1,), like an Ensemble of one;
    not vmapped, so that it computes bit for bit what train.py's own step computes."""

    def __init__(self, model: Transformer, capturable: bool = False, bf16: bool = False,
                 kernels: fastpath.Kernels | None = fastpath.Kernels(), **adamw):
        self.module, self.bf16 = on_device(model, kernels), bf16
        self.opt = torch.optim.AdamW(model.parameters(), capturable=capturable, **adamw)

    def parameters(self) -> list[torch.Tensor]:
        return list(self.module.parameters())

    def step(self, seqs: torch.Tensor, task: torch.Tensor) -> torch.Tensor:
        with mixed_precision(self.bf16, seqs.device):
            loss = lm_loss(self.module, seqs[0], task[0])
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        return loss.detach()[None]

    def model(self, e: int) -> Transformer:
        return self.module

    @torch.no_grad()
    def dense_readouts(self, train_seqs: torch.Tensor, gen_seqs: torch.Tensor, train_task: torch.Tensor) -> dict[str, torch.Tensor]:
        return {k: v[None] for k, v in dense_readouts(self.module, train_seqs[0], gen_seqs[0], train_task[0]).items()}

    def member_state(self, e: int) -> dict:
        return {"model": self.module.state_dict(), "optimizer": self.opt.state_dict()}

    def load_member_states(self, states: list[dict]):
        self.module.load_state_dict(states[0]["model"])
        self.opt.load_state_dict(with_capturable(states[0]["optimizer"], self.opt.defaults["capturable"]))


class Ensemble:
    """E models of one architecture trained in lockstep, weights stacked as (E, ...) tensors.

    Members may differ in anything that is not a shape of the step (K, seed, task set); N, batch, D
    and C are common (train.py checks). With task injection at several K, each member's (K, D) table is padded
    with zero rows to the largest K: rows a member never indexes get no gradient, and AdamW keeps a zero row with
    zero moments at zero, so its first K rows train as its own table; model(e) and member_state(e) give those
    rows back, and the readouts see the padding as the mean of the K rows (Transformer.injected's mean over the
    table, for fresh chains, is then the member's own to float rounding)."""

    def __init__(self, models: list[Transformer], capturable: bool = False, bf16: bool = False,
                 kernels: fastpath.Kernels | None = fastpath.Kernels(), **adamw):
        self.E, self.bf16 = len(models), bf16
        self.n_tasks = [m.task_embedding.num_embeddings if m.task_embedding is not None else 0 for m in models]
        # one member's weights go here to evaluate or save it: a model per table size
        self.scratch = {}
        for model, K in zip(models, self.n_tasks):
            self.scratch.setdefault(K, on_device(copy.deepcopy(model), kernels))
        # the architecture (functional_call takes each weight's shape from self.params)
        self.template = copy.deepcopy(self.scratch[self.n_tasks[0]]).to("meta")
        K_max = max(self.n_tasks)
        self.params, self.buffers = stack_module_state([padded_tasks(m, K_max) for m in models])  # name -> (E, ...)
        self.opt = torch.optim.AdamW(self.params.values(), capturable=capturable, **adamw)
        self.padding = None  # (E, K_max, 1): 1 at a member's padding rows; None where no member is padded
        if len(set(self.n_tasks)) > 1:
            rows = torch.arange(K_max, device=self.params[TASKS].device)
            self.padding = (rows[None, :, None] >= rows.new_tensor(self.n_tasks)[:, None, None]).float()

    def parameters(self) -> list[torch.Tensor]:
        return list(self.params.values())

    def _member(self, params: dict, buffers: dict):
        """Member weights (slices seen inside vmap) -> a callable with the model's forward signature."""
        return lambda seqs, **kw: functional_call(self.template, (params, buffers), (seqs,), kw)

    def own(self, name: str, e: int, tensor: torch.Tensor) -> torch.Tensor:
        """Member e's part of a stacked weight (or of its AdamW state) `tensor`[e]: its K rows of a padded task table."""
        return tensor[e][:self.n_tasks[e]] if name == TASKS and self.padding is not None else tensor[e]

    def step(self, seqs: torch.Tensor, task: torch.Tensor) -> torch.Tensor:
        """One AdamW step of every member on its own batch, seqs (E, B, N + 1), chains task (E, B) -> losses (E,)."""
        with mixed_precision(self.bf16, seqs.device):
            losses = vmap(lambda p, b, s, t: lm_loss(self._member(p, b), s, t))(self.params, self.buffers, seqs, task)
        self.opt.zero_grad(set_to_none=True)
        losses.sum().backward()  # members share no weights: each gets the gradient of its own loss
        self.opt.step()
        return losses.detach()

    def model(self, e: int) -> Transformer:
        """Member e as a plain Transformer (a copy of its weights, valid until the next call)."""
        scratch = self.scratch[self.n_tasks[e]]
        with torch.no_grad():
            for name, p in scratch.named_parameters():
                p.copy_(self.own(name, e, self.params[name]))
        return scratch

    @torch.no_grad()
    def dense_readouts(self, train_seqs: torch.Tensor, gen_seqs: torch.Tensor, train_task: torch.Tensor) -> dict[str, torch.Tensor]:
        """dense_readouts() of all members in one batched call: (E, n, N + 1) each, chains (E, n) -> dict of (E,)."""
        params = self.params
        if self.padding is not None:  # a member's padding rows as the mean of its K rows (its zero rows add nothing)
            table = params[TASKS]
            K = (1 - self.padding).sum(1, keepdim=True)  # (E, 1, 1)
            params = {**params, TASKS: table + self.padding * (table.sum(1, keepdim=True) / K)}
        return vmap(lambda p, b, tr, ge, t: dense_readouts(self._member(p, b), tr, ge, t))(
            params, self.buffers, train_seqs, gen_seqs, train_task)

    def member_state(self, e: int) -> dict:
        """Member e's weights and AdamW state in the format of a single run's checkpoint (copies, so
        that saving one member does not write the whole stacked storage)."""
        names = list(self.params)
        opt = self.opt.state_dict()
        state = {i: {k: v if k == "step" else self.own(names[i], e, v).clone() for k, v in s.items()}
                 for i, s in opt["state"].items()}
        return {"model": {n: self.own(n, e, self.params[n]).detach().clone() for n in names},
                "optimizer": {"state": state, "param_groups": opt["param_groups"]}}

    def load_member_states(self, states: list[dict]):
        """The inverse of member_state over all members: stack E single-run states back."""
        if len(states) != self.E:
            raise ValueError(f"{len(states)} member states for an ensemble of {self.E}")
        names, K_max = list(self.params), max(self.n_tasks)
        stack = lambda name, ts: torch.stack([padded_rows(t, K_max) if name == TASKS else t for t in ts])  # noqa: E731
        with torch.no_grad():
            for name, p in self.params.items():
                p.copy_(stack(name, [s["model"][name] for s in states]))
        opts = [s["optimizer"] for s in states]
        state = {i: {k: v if k == "step" else stack(names[i], [o["state"][i][k] for o in opts]) for k, v in s.items()}
                 for i, s in opts[0]["state"].items()}
        self.opt.load_state_dict(with_capturable({"state": state, "param_groups": opts[0]["param_groups"]},
                                                 self.opt.defaults["capturable"]))


# ----------------------------------------------------------------------------- CUDA graph


class GraphedStep:
    """trainer.step captured once in a CUDA graph and replayed: forward, backward and AdamW (created with
    capturable=True) in one launch, so a step costs no Python and no kernel-launch overhead.

    sample: () -> (seqs (E, B, N + 1), chains (E, B)), the batch sampler, drawing from the CUDA generators
    `generators` only (fastdata.batches of task sets): it is captured in the same graph, so that a replay draws
    its batch on the device too, and step() takes no batch. A graph replays the random draws of its capture at
    fresh Philox offsets: each replay advances every generator by what the captured calls drew, so replay i
    draws the numbers of the i-th eager call, and a generator's state after i replays is the eager one (its
    checkpoints resume exactly; tests/test_ensemble.py pins both on a GPU). Without `sample` (a sampler that
    waits for the device, as K = inf's rejection sampling does), batches are drawn outside and step(seqs, chains)
    copies them into a static input. Either way self.seqs, self.task hold the last replay's batch, and the
    returned loss tensor is overwritten by the next replay.

    Capturing needs a few eager warm-up steps (lazy AdamW state, library handles); they run on a side
    stream, and the weights, the optimizer state and the generators they changed are put back before the capture."""

    def __init__(self, trainer, shape: tuple[int, ...], device: torch.device, warmup: int = 3,
                 sample=None, generators: list[torch.Generator] = ()):
        self.trainer, self.samples = trainer, sample is not None
        if not self.samples:
            seqs = torch.zeros(shape, dtype=torch.long, device=device)  # static inputs: (E, B, N + 1)
            task = torch.zeros(shape[:2], dtype=torch.long, device=device)  # and the chains (E, B)
            sample = lambda: (seqs, task)  # noqa: E731
        params, opt = trainer.parameters(), trainer.opt
        saved_params = [p.detach().clone() for p in params]
        saved_state = {p: {k: v.clone() for k, v in opt.state[p].items()} for p in params if p in opt.state}
        saved_rng = [g.get_state() for g in generators]
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(warmup):
                trainer.step(*sample())
        torch.cuda.current_stream(device).wait_stream(side)
        with torch.no_grad():
            for p, saved in zip(params, saved_params):
                p.copy_(saved)
            for p in params:  # a fresh AdamW state is all zeros, step count included
                for k, v in opt.state[p].items():
                    if p in saved_state:
                        v.copy_(saved_state[p][k])
                    else:
                        v.zero_()
        for g, state in zip(generators, saved_rng):  # a generator's state is its host-side seed and offset
            g.set_state(state)
        opt.zero_grad(set_to_none=True)  # gradients are then allocated inside the graph's memory pool
        self.graph = torch.cuda.CUDAGraph()
        with warnings.catch_warnings():  # torch >= 2.12 registers a generator at its first draw in a capture and
            warnings.simplefilter("ignore")  # warns that this call is a no-op; earlier versions (2.11) need it
            for g in generators:
                self.graph.register_generator_state(g)
        with torch.cuda.graph(self.graph):
            self.seqs, self.task = sample()
            self.loss = trainer.step(self.seqs, self.task)

    def step(self, *batch: torch.Tensor) -> torch.Tensor:
        """One replay -> the losses (E,). batch: (seqs, chains) to copy into the static inputs, or nothing where the
        graph samples its own."""
        if bool(batch) == self.samples:
            raise ValueError("a GraphedStep with a sampler draws its own batches; one without takes (seqs, chains)")
        for static, x in zip((self.seqs, self.task), batch):
            static.copy_(x)
        self.graph.replay()
        return self.loss


def sampled_step(trainer, tasks: list, gens: list[torch.Generator], shape: tuple[int, int, int], device: torch.device,
                 graph: bool):
    """() -> losses (E,): every member's batch drawn from its task source and generator (fastdata.batches: member
    e's is tasks[e].batch(B, N + 1, gens[e]), shape (E, B, N + 1)), then one step of `trainer`. graph (CUDA): the
    step replayed as a CUDA graph (ensemble.GraphedStep) with the sampler captured inside it, so that sampling costs
    no host launches; K = inf's rejection sampling waits for the device and cannot be captured, so its batches
    are drawn before each replay."""
    def sample():
        return fastdata.batches(tasks, shape[1], shape[2], gens)

    if not graph:
        return lambda: trainer.step(*sample())
    if all(isinstance(t, TaskSet) for t in tasks):
        return GraphedStep(trainer, shape, device, sample=sample, generators=gens).step
    replay = GraphedStep(trainer, shape, device).step
    return lambda: replay(*sample())


def accelerate_run(model: Transformer, optimizer: torch.optim.Optimizer, step, train_step, tasks, gen: torch.Generator,
                   shape: tuple[int, int]):
    """train.py's speed block: the engine's pieces for one run, the same computation to float rounding. step: the
    run's plain step, () -> loss, a batch tasks.batch(*shape, gen) and train_step(seqs, chains) on it. Returns (step,
    predict): the predictors of the run's evaluations are fastdata.predict (the memorizing ones from anchored sums,
    equal to bayes.predict to float32 rounding: tests/test_bayes.py). On CUDA also the Triton kernels in the model
    (fastpath.accelerate, in place) and the sampler and train_step captured once as one CUDA graph and replayed
    (sampled_step: forward, backward and AdamW in one launch, on the batches the plain step draws), for which AdamW
    is made capturable in place; elsewhere the plain step itself."""
    device = next(model.parameters()).device
    if device.type != "cuda":
        return step, fastdata.predict
    fastpath.accelerate(model)
    optimizer.load_state_dict(with_capturable(optimizer.state_dict(), True))  # its step counters move to the device

    def member_step(seqs: torch.Tensor, chains: torch.Tensor) -> torch.Tensor:  # an ensemble of one: (1, B, N + 1)
        return train_step(seqs[0], chains[0])[None]

    trainer = SimpleNamespace(parameters=lambda: list(model.parameters()), opt=optimizer, step=member_step)
    replay = sampled_step(trainer, [tasks], [gen], (1, *shape), device, graph=True)

    def graphed_step() -> torch.Tensor:
        """One replay of the graph: the next batch, drawn on the device, and train_step on it."""
        return replay()[0]

    return graphed_step, fastdata.predict
