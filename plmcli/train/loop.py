"""THE training loop: one for every objective, on accelerate.

The loop knows nothing about models or masking: it asks the objective for batches (random access by
micro-batch index, so the data position is one integer) and for `step(model, batch, state)`.
"""

from __future__ import annotations

import signal
import time
import warnings
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import torch

from plmcli.data.batching import CountFrom, to_device
from plmcli.data.mixing import names_of
from plmcli.data.store import has_split, load_meta, writing
from plmcli.errors import Interrupted, PlmError
from plmcli.models.base import CountsFlops
from plmcli.models.checkpointing import apply_activation_checkpointing
from plmcli.runs import list_checkpoints
from plmcli.train import checkpoint as ckpt
from plmcli.train.distributed import (DIST_TIMEOUT, check_resume_world, configure_backend, full_norm, process_state,
                                      save_weights, sharded, tied_names, use_cpu)
from plmcli.train.health import StepHealth, loss_scale
from plmcli.train.optim import build_optimizer, skips_on_device
from plmcli.train.peaks import peak_flops
from plmcli.train.peers import Peers
from plmcli.train.progress import MetricsLog, TrainProgress
from plmcli.train.trackers import log_with
from plmcli.train.validation import evaluate
from plmcli.train.signals import DeferredStop, ignore_stop_signals, signal_number
from plmcli.train.schedule import build_scheduler

def make_accelerator(mixed_precision: str, dist_timeout_s: int = DIST_TIMEOUT, accum: int = 1, report_to=None, run_dir=None):
    """A fresh Accelerator on this process's process group, accumulating over `accum` micro-batches, tracking to report_to."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState
    from accelerate.utils import GradientAccumulationPlugin, InitProcessGroupKwargs

    cpu = use_cpu()
    cuda = torch.cuda.is_available() and not cpu
    mixed_precision = resolve_precision(mixed_precision, cuda, cuda and torch.cuda.is_bf16_supported())
    process_state(dist_timeout_s)  # the process group, unless pretrain / finetune already made it
    # Several runs in one process (tests, notebooks, phases) each get a fresh precision setting.
    AcceleratorState._reset_state()
    return Accelerator(cpu=cpu, mixed_precision=mixed_precision, log_with=log_with(report_to, run_dir), project_dir=run_dir,
                       # A plugin, not gradient_accumulation_steps=: accelerate would let a launch config's value win.
                       gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=accum, sync_with_dataloader=False),
                       kwargs_handlers=[InitProcessGroupKwargs(timeout=timedelta(seconds=dist_timeout_s))])


def resolve_precision(requested: str, cuda: bool, bf16: bool) -> str:
    """train.mixed_precision as accelerate takes it. auto: bf16 where the GPU has it; else mixed precision as
    Micikevicius et al. 2018 describe it, fp16 compute with fp32 master weights and dynamic loss scaling (V100, T4); fp32 on a CPU."""
    if requested == "auto":
        return ("bf16" if bf16 else "fp16") if cuda else "no"
    if requested == "fp16" and not cuda:
        raise PlmError("train.mixed_precision=fp16 needs a GPU", "use --set train.mixed_precision=bf16 (or no) on a CPU")
    return requested


def draw_seed(seed: int, micro_batch: int) -> int:
    """The seed of every random draw in one training micro-batch (dropout, ELECTRA's samples, ...): a function
    of the run's seed and the micro-batch's index over all processes (micro-batch k of rank r is k·world + r),
    so the weights do not depend on how a global batch is split over processes and accumulation."""
    return (seed * 0x9E3779B97F4A7C15 + micro_batch) % (1 << 63)


def seed_draws(seed: int, device: torch.device) -> None:
    """Seed the generators a micro-batch draws from: the CPU's and its device's (torch.manual_seed also walks
    every other backend's, 80 µs a call on a CPU)."""
    torch.default_generator.manual_seed(seed)
    if device.type == "cuda":
        torch.cuda.manual_seed(seed)
    elif device.type != "cpu":
        torch.manual_seed(seed)


def batch_sizes(global_batch: int, micro: int, world: int) -> tuple[int, int]:
    """(micro batch per device, accumulation steps) for a global batch on `world` processes."""
    if global_batch % world:
        fit = -(-global_batch // world) * world
        raise PlmError(f"train.global_batch_size {global_batch} cannot be split evenly over {world} processes",
                       f"pick a multiple of the process count, e.g. --set train.global_batch_size={fit}")
    micro = micro or global_batch // world
    if global_batch % (micro * world):
        raise PlmError(f"train.global_batch_size {global_batch} is not a multiple of micro batch {micro} × {world} processes",
                       "adjust train.micro_batch_size or train.global_batch_size")
    return micro, global_batch // (micro * world)




def train(recipe, model, objective, corpus_dir, run_dir: Path, *, resume_from: Path | None = None,
          stop_after: int | None = None, console=None, select_metric: str | None = None,
          continue_with: str | None = None) -> dict:
    """Train `model` with `objective` on `corpus_dir` as the recipe says; returns the summary.

    With `select_metric` (a key of the evaluation results, higher is better) model.safetensors holds
    the best evaluated weights instead of the last ones, and the summary reports that evaluation.
    On N processes (accelerate launch, torchrun) every process runs this; the main one writes files.

    Ctrl-C stops at the next optimizer-step boundary with a checkpoint of that step and raises
    Interrupted; `continue_with` is the command its message (and a write failure's) gives to continue.
    A Ctrl-C after the last step has nothing left to stop: the run ends as it would have, weights written.
    An optimizer step whose loss (or, with clipping, gradient norm) is not finite is skipped: it
    counts as a step (its data is consumed and the schedule moves on, so a resume stays exact) but neither
    the weights nor the optimizer's state move; train.max_nonfinite_steps of them in a row stop the run
    (checkpoint.RunStopped), as does fp16's loss scale falling below train.min_loss_scale.
    """
    run = _Training(recipe, objective, Path(run_dir), resume_from, stop_after, select_metric, continue_with)
    run.setup(model, corpus_dir, console)
    return run.run()


class _Training:
    """One call of `train`, in torchtune's recipe lifecycle: __init__ reads the config, `setup` builds all the steps
    use (every attribute is set in these two), `run` steps until a stop reason, each step followed by its logging,
    evaluation and checkpoint."""

    def __init__(self, recipe, objective, run_dir: Path, resume_from, stop_after, select_metric, continue_with):
        self.recipe, self.t, self.o, self.objective, self.run_dir = recipe, recipe.train, recipe.optim, objective, run_dir
        self.resume_from, self.stop_after = resume_from, stop_after
        self.select_metric, self.continue_with = select_metric, continue_with
        dist = process_state(self.t.dist_timeout)
        self.world, self.rank = dist.num_processes, dist.process_index
        self.micro, self.accum = batch_sizes(self.t.global_batch_size, self.t.micro_batch_size, self.world)
        self.accelerator = make_accelerator(self.t.mixed_precision, self.t.dist_timeout, self.accum, self.t.report_to, run_dir)
        if self.accelerator.device.type == "cuda":  # set either way: a run must not inherit the last one's choice
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = self.t.tf32
        self.loop = ckpt.LoopState()
        # train.eval_batches counts batches of the recipe's micro batch (its global batch when that is 0), so
        # an evaluation scores the same samples on any number of processes: as this launch's micro-batches.
        ref = self.t.micro_batch_size or self.t.global_batch_size
        self.eval_limit = -(-self.t.eval_batches * ref // self.micro)
        self.notice = None
        if resume_from is not None:  # checked before anything is built: a refusal costs nothing
            self.loop = ckpt.read_loop_state(resume_from)
            self.notice = _resumable(self.loop, resume_from, self.accelerator, self.world, self.micro,
                                     self.t.global_batch_size)

    def setup(self, model, corpus_dir, console) -> None:
        """Optimizer, schedule, streams, the wrapped model (in the order that fixes the RNG's draws), then `begin`."""
        t, o, accelerator, objective = self.t, self.o, self.accelerator, self.objective
        apply_activation_checkpointing(model, t.activation_checkpointing)  # before DDP wraps and compile traces it
        optimizer = build_optimizer(model, o.name, o.lr, o.weight_decay, tuple(o.betas), o.eps, o.momentum)
        self.scheduler = build_scheduler(optimizer, o.schedule, o.warmup(t.max_steps), t.max_steps, o.min_lr_ratio,
                                         o.power, decay_factor=o.decay_factor, decay_every=o.decay_every,
                                         decay_start=o.decay_start)
        from plmcli.train.distributed import main_builds_first

        with main_builds_first():  # a stream builds its flat caches (tokens, rows, units) once; the others read them
            self.train_stream = objective.stream(corpus_dir, "train", self.micro, t.seed, self.rank, self.world, shuffle=True)
            self.val_stream = objective.stream(corpus_dir, "validation", self.micro, t.seed, self.rank, self.world,
                                               shuffle=False) if has_split(load_meta(corpus_dir), "validation") else None
        self.sources = names_of(corpus_dir)  # a mix's sources: each gets its validation loss
        # Streaming seam: an iterable stream (data/streaming.py) has no random access; it keeps its own
        # data position, restored here and saved with every checkpoint, and serves its batches in order.
        self.sequential = isinstance(self.train_stream, torch.utils.data.IterableDataset)
        self.tied = tied_names(model)
        configure_backend(accelerator, model, t, o.name, self.micro, self.accum)
        if self.world > 1 and not sharded(accelerator):
            if not self.sequential:
                probe = self.train_stream[self.loop.micro_batches]
            else:  # a stream read in order has no batch k to look at; a validation batch serves
                probe = self.val_stream[0] if self.val_stream is not None else None
            accelerator.ddp_handler = _ddp_settings(accelerator, model, objective, probe)
        with warnings.catch_warnings():
            # torch calls broadcast_buffers deprecated, yet names it the way to keep buffers out of DDP's syncs
            warnings.filterwarnings("ignore", message="`broadcast_buffers` is deprecated", category=FutureWarning)
            self.model, self.optimizer = accelerator.prepare(model, optimizer)
        # Not prepared: accelerate would step it once per process; our schedule counts optimizer steps.
        accelerator.register_for_checkpointing(self.scheduler)
        # Inductor's CPU kernels sum index_put's rows (an embedding's gradient) with atomics from several threads:
        # the weights would differ in the last bit from run to run. Deterministic mode, while `run` compiles and
        # steps, makes it call aten's ordered kernel instead, so a compiled CPU run repeats bitwise.
        self.deterministic = t.compile and accelerator.device.type == "cpu"
        if t.compile:
            # In place, not torch.compile(model): its wrapper's state dict prefixes every key with `_orig_mod.`,
            # and model.safetensors would no longer load into the model.
            self.model.compile()
        if self.resume_from is not None:
            ckpt.load_checkpoint(accelerator, self.resume_from)
            accelerator.step = 0  # accumulate()'s micro-step counter: a checkpoint is always at an optimizer step
        self.begin(console)

    def _batches(self):
        """The training micro-batches from the loop's data position on."""
        from plmcli.data.batching import batch_loader, loader_workers

        t, loop, stream = self.t, self.loop, self.train_stream
        device = self.accelerator.device.type
        # Batches are built in worker processes ahead of the step (ARCHITECTURE.md, "GPU first"), the same whatever their number.
        workers, pin = loader_workers(t.num_workers, accelerated=device != "cpu"), device == "cuda"
        if self.sequential and loop.data_position is not None:
            stream.load_state_dict(loop.data_position)
        if self.sequential:
            return iter(stream.loader(workers, pin_memory=pin, worker_init_fn=ignore_stop_signals))
        return iter(batch_loader(stream, workers, sampler=CountFrom(loop.micro_batches), pin_memory=pin,
                                 worker_init_fn=ignore_stop_signals, seed=t.seed))

    def begin(self, console) -> None:
        """What the steps keep track of: logs, progress, the throughput window, health, the peers' agreement."""
        t, accelerator = self.t, self.accelerator
        self.main = accelerator.is_main_process
        self.log = MetricsLog(self.run_dir, enabled=self.main, step=self.loop.step, tracked=(accelerator, self.recipe))  # a resume redoes later steps
        unwrapped = accelerator.unwrap_model(self.model)
        fpt = unwrapped.flops_per_token(t.seq_len) if isinstance(unwrapped, CountsFlops) else None
        self.fpt, self.peak = fpt, peak_flops(accelerator.device, accelerator.mixed_precision)
        self.batches = self._batches()
        self.state = self.objective.init_state()
        # progress: the run dir, steps and a time estimate first; then the bar per step and micro-batch
        self.progress = TrainProgress(console, t.max_steps, self.loop.step, enabled=self.main, accum=self.accum,
                                      compiled=t.compile)
        self.progress.begin(self.run_dir, self.recipe, unwrapped, fpt, accelerator.device, self.world,
                            accelerator.mixed_precision)
        if self.notice and self.main:
            self.progress.console.print(self.notice, highlight=False, soft_wrap=True)
        self.window = {"t0": time.perf_counter(), "tokens": 0, "sums": {}, "count": 0.0}
        # A finished run resumed reports what it reported then: its last evaluation and logged loss.
        self.last_eval, self.reason = self.loop.last_eval, self.stop_reason()
        self.best = self.loop.best
        self.health = StepHealth(accelerator.device, self.loop.step, self.loop.nonfinite_steps)
        self.check_grads = t.grad_clip > 0 and accelerator.scaler is None  # fp16's scaler skips overflowing steps itself
        self.grad_norm = None
        self.model.train()
        self.start = time.perf_counter() - self.loop.elapsed
        self.peers = Peers(self.rank, self.world, t.dist_timeout)
        self.interrupt = DeferredStop()

    def run(self) -> dict:
        """Optimizer steps until a stop reason; the summary. Ctrl-C is deferred from the first step to the return."""
        peers = self.peers
        determinism = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
        if self.deterministic:
            torch.use_deterministic_algorithms(True, warn_only=True)
        self.interrupt.install()
        try:
            while self.reason is None:
                stop_asked = self.optimizer_step()
                self.after_step(stop_asked)
            return self.finish()
        except KeyboardInterrupt:  # a second Ctrl-C: at once, mid-step; the last complete checkpoint stays
            raise Interrupted(f"stopped at once (a second Ctrl-C) after step {self.loop.step}; {self.saved()}") from None
        except RuntimeError as e:  # another process died: say which, instead of the backend's traceback
            if peers.failed(e):
                raise peers.lost(e, self.saved()) from e
            raise
        finally:
            self.batches = None  # the DataLoader's workers stop here, while a Ctrl-C is still deferred
            torch.use_deterministic_algorithms(determinism[0], warn_only=determinism[1])
            self.interrupt.restore()
            self.progress.close()
            self.log.close()

    def stop_reason(self) -> str | None:
        t, loop = self.t, self.loop
        if loop.step >= t.max_steps:
            return "max_steps"
        if t.max_tokens and loop.tokens >= t.max_tokens:
            return "max_tokens"
        if t.time_budget and loop.elapsed >= t.time_budget:
            return "time_budget"
        if self.stop_after and loop.step >= self.stop_after:
            return "stop_after"
        return None

    def micro_batches(self) -> tuple[int, object, dict, object]:
        """The accumulated forward/backward passes of one optimizer step: (tokens, loss, metric sums, count).

        Each part of the loss is a sum over its targets divided by their count in all of the step's
        micro-batches on every process, as one big batch would give it (counted from the batches before
        any forward); every random draw of micro-batch k is seeded by (seed, its global index)."""
        accelerator, objective, model = self.accelerator, self.objective, self.model
        batches = [next(self.batches) for _ in range(self.accum)]
        shares = self.loss_shares([objective.loss_counts(b) for b in batches])
        # The parts are already means over the whole step: undo accumulate()'s 1/accum and DDP's 1/world.
        scale = self.accum * self.world
        step_tokens, step_loss, step_sums, step_count = 0, 0.0, {}, 0.0
        for batch, share in zip(batches, shares):
            seed_draws(draw_seed(self.t.seed, self.loop.micro_batches * self.world + self.rank), accelerator.device)
            step_tokens += objective.tokens_in(batch)
            batch = to_device(batch, accelerator.device)
            # accumulate(): no gradient all-reduce until the last micro-batch (DeepSpeed: inside its engine).
            with accelerator.accumulate(model):
                with accelerator.autocast():
                    out = objective.step(model, batch, self.state)
                parts = out.parts if out.parts is not None else {"loss": out.loss}
                loss = sum(part * share[name] for name, part in parts.items())
                accelerator.backward(loss * scale)
            self.state = out.state
            self.loop.micro_batches += 1
            self.progress.micro_batch()  # progress: host-side; on a GPU a sync only around the micro-batches it times
            step_loss = step_loss + loss.detach().float()
            for name, v in out.metrics.items():
                step_sums[name] = step_sums.get(name, 0) + v.float()
            step_count = step_count + out.count
        return step_tokens, step_loss, step_sums, step_count

    def loss_shares(self, counts: list[dict]) -> list[dict]:
        """Per micro-batch, each loss part's share of the step: its targets over their count in all of the
        step's micro-batches on every process (one small all-reduce, no host read)."""
        names = sorted(counts[0])
        # The counts come from the batches as the loader gave them (host memory): no device read here.
        local = torch.stack([torch.stack([torch.as_tensor(c[n]).float() for n in names]) for c in counts])
        local = local.to(self.accelerator.device, non_blocking=True)  # (accum, parts)
        total = local.sum(0)
        if self.world > 1:
            total = self.accelerator.reduce(total, reduction="sum")
        share = local / total.clamp(min=1)
        return [{n: share[i, j] for j, n in enumerate(names)} for i in range(len(counts))]

    def optimizer_step(self) -> str | None:
        """One optimizer step; the stop signal (SIGINT, SIGTERM, SIGUSR1) that any process received, to stop
        after it, or None.

        A step whose loss (or, with clipping, gradient norm) is not finite on any process is skipped on the
        device: the optimizer gets the flag as `found_inf` (GradScaler's contract with torch's fused kernels)
        and leaves weights, moments and step count as they were; under fp16 the scaler skips an overflowing
        step the same way and halves its scale. The schedule moves on: a step's learning rate is a function of
        its number, which the host knows without asking the device. Nothing here reads a device value."""
        t, accelerator, loop, window = self.t, self.accelerator, self.loop, self.window
        step_tokens, step_loss, step_sums, step_count = self.micro_batches()
        self.grad_norm = full_norm(accelerator.clip_grad_norm_(self.model.parameters(), t.grad_clip)) if t.grad_clip > 0 else None
        skipped, loss = self.nonfinite(step_loss)
        scale = loss_scale(accelerator.scaler)  # updated in place by the scaler's step
        before = None if scale is None else scale.clone()
        self.step_unless(skipped)
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        if before is not None:  # the scaler backs its scale off exactly when it skipped the step
            skipped = scale < before
        self.health.update(skipped, loss, scale)
        for name, v in step_sums.items():
            window["sums"][name] = window["sums"].get(name, 0) + v.masked_fill(skipped, 0.0)
        window["count"] = window["count"] + torch.as_tensor(step_count).masked_fill(skipped, 0.0)
        step_tokens, elapsed, stop_asked = self.peers.agree(step_tokens, time.perf_counter() - self.start,
                                                            signal_number(self.interrupt.requested))
        loop.step += 1
        loop.tokens += step_tokens
        window["tokens"] += step_tokens
        loop.elapsed = elapsed
        self.reason = self.stop_reason()
        # At the run's end the counts are read exactly: a run may not end on a skipped step as if it trained.
        self.check_health(self.health.read() if self.reason else self.health.arrived())
        self.progress.step(loop.step)  # progress: the bar and its ETA every step; the loss stays the last logged
        return signal.Signals(stop_asked).name if stop_asked else None

    def nonfinite(self, step_loss) -> tuple[torch.Tensor, torch.Tensor]:
        """(skip this step, the step's loss over every process), both on the device."""
        bad = ~torch.isfinite(step_loss)
        if self.check_grads:  # the clipped norm is of the gradients all processes share
            bad = bad | ~torch.isfinite(self.grad_norm)
        both = torch.stack([torch.as_tensor(step_loss).float(), bad.float()])
        if self.world > 1:  # a NaN on one process skips the step on all of them (on the device: no host read)
            both = self.accelerator.reduce(both, reduction="sum")
        return both[1] > 0, both[0]

    def step_unless(self, skipped: torch.Tensor) -> None:
        """optimizer.step(), unless `skipped`: decided by the optimizer on the device where it can (fused AdamW,
        Adam, SGD, and LAMB take `found_inf`); fp16's scaler sets that itself; otherwise read on the host."""
        inner = self.optimizer.optimizer
        if self.accelerator.scaler is not None or self.accelerator.state.deepspeed_plugin is not None:
            self.optimizer.step()
        elif skips_on_device(inner):
            inner.found_inf = skipped.float()
            try:
                self.optimizer.step()
            finally:
                del inner.found_inf
        elif not bool(skipped):  # a device with no fused kernel: one sync a step
            self.optimizer.step()

    def check_health(self, health: dict | None) -> None:
        """Stop a run whose steps keep being skipped (train.max_nonfinite_steps in a row, or one at its end) or
        whose fp16 loss scale collapsed below train.min_loss_scale, naming the last good checkpoint."""
        if health is None:
            return
        t, step = self.t, health["step"]
        if health["run"] and (health["run"] >= t.max_nonfinite_steps or self.reason):
            raise ckpt.RunStopped(*_diverged(self.recipe, health, step, self.saved()))
        if self.accelerator.scaler is not None and health["scale"] and health["scale"] < t.min_loss_scale:
            raise ckpt.RunStopped(
                f"fp16 loss scale collapsed to {health['scale']:g} at step {step} (below train.min_loss_scale "
                f"{t.min_loss_scale:g}): the gradients overflow fp16 even unscaled; no model.safetensors was written",
                f"use --set train.mixed_precision=bf16 where the GPU has it (else no), or a lower optim.lr "
                f"(now {self.o.lr:g}); {self.saved()}")

    def after_step(self, stop_asked: str | None) -> None:
        """The step's log row, evaluation (best weights) and checkpoint, as the recipe schedules them; then a
        stop signal's stop."""
        t, loop, reason = self.t, self.loop, self.reason
        if (loop.step % t.log_every == 0 or reason) and self.window["sums"]:
            row = _log_row(self.accelerator, loop, self.window, self.scheduler, self.grad_norm, self.fpt, self.peak)
            health = self.health.read()
            if health["nonfinite_steps"] or self.accelerator.scaler is not None:
                row["nonfinite_steps"] = health["nonfinite_steps"]
            if self.accelerator.scaler is not None:
                row["loss_scale"] = health["scale"]
            self.log.write(row)
            loop.train_loss = row.get("loss", loop.train_loss)
            self.progress.update(loop.step, row, self.last_eval)
        if self.val_stream is not None and ((t.eval_every and loop.step % t.eval_every == 0) or reason):
            self.last_eval = loop.last_eval = evaluate(self.accelerator, self.model, self.objective, self.val_stream,
                                                          self.eval_limit, self.sources)
            self.log.write({"step": loop.step, "tokens": loop.tokens, **self.last_eval})
            self.progress.update(loop.step, None, self.last_eval)
            # Every process reaches the same verdict (the metrics are reduced over all of them).
            if self.select_metric and (not self.best or self.last_eval[self.select_metric] > self.best[self.select_metric]):
                self.best = loop.best = {"step": loop.step, **self.last_eval}
                self.weights()
        # The agreed clock: every process takes the same decision.
        due = t.save_every_minutes and loop.elapsed - loop.saved_elapsed >= 60 * t.save_every_minutes
        # A checkpoint while the loss is not finite would not be a good one to go back to.
        if ((t.save_every and loop.step % t.save_every == 0) or due or reason or stop_asked) and \
                not self.health.read()["run"]:
            loop.saved_elapsed = loop.elapsed
            self.snapshot()
        if stop_asked:  # this step is complete and (unless its loss was not finite) saved
            raise Interrupted(f"stopped after step {loop.step} ({stop_asked}); {self.saved()}", stop_asked)

    def finish(self) -> dict:
        """The summary, after the last weights are written (unless the best evaluated ones already were)."""
        loop = self.loop
        summary = {"steps": loop.step, "tokens": loop.tokens, "elapsed_s": round(loop.elapsed, 2),
                   "stop_reason": self.reason, "train_loss": loop.train_loss, **self.last_eval}
        loop.nonfinite_steps = self.health.read()["nonfinite_steps"]
        if loop.nonfinite_steps:
            summary["nonfinite_steps"] = loop.nonfinite_steps
        if self.select_metric and self.best:
            summary["best"] = self.best
        else:
            self.weights()
        self.accelerator.wait_for_everyone()
        return summary

    def snapshot(self):
        self.loop.nonfinite_steps = self.health.read()["nonfinite_steps"]
        if self.sequential:  # streaming seam: every process takes part (the positions are gathered)
            self.loop.data_position = self.train_stream.state_dict()
        return ckpt.save_checkpoint(self.accelerator, self.run_dir, self.loop.step,
                                    replace(self.loop, world_size=self.world, global_batch_size=self.t.global_batch_size,
                                            micro_batch_size=self.micro),
                                    self.t.keep_checkpoints, self.continue_with)

    def weights(self) -> None:
        with writing("model.safetensors", self.run_dir / ".model.safetensors.tmp", self.continue_with):
            save_weights(self.accelerator, self.model, self.run_dir, self.tied)

    def saved(self) -> str:
        """Where the run can continue from, for the messages of a stop."""
        found = list_checkpoints(self.run_dir) if self.main else []
        then = f"; continue with `{self.continue_with}`" if self.continue_with else ""
        if not found:
            return "no checkpoint was written yet" + (f"; `{self.continue_with}` starts it again from step 0"
                                                      if self.continue_with else "")
        return f"the checkpoint of step {found[-1].name.split('-')[1]} is in {found[-1]}{then}"


def _diverged(recipe, bad: dict, step: int, saved: str) -> tuple[str, str]:
    """The message and hint of a run stopped by non-finite steps."""
    t, o = recipe.train, recipe.optim
    steps = f"step {bad['first']}" if bad["run"] == 1 else f"{bad['run']} optimizer steps in a row (steps {bad['first']}-{step})"
    return (f"training diverged: the loss or gradient was not finite at {steps}, loss {bad['loss']} at step {bad['first']} "
            f"(skipped, no update); no model.safetensors was written",
            f"start again with a lower optim.lr (now {o.lr:g}, e.g. --set optim.lr={o.lr / 10:g}), gradient clipping "
            f"(train.grad_clip, now {t.grad_clip:g}) or train.mixed_precision=no (now {t.mixed_precision}); {saved}")


def _ddp_settings(accelerator, model, objective, batch):
    """How DistributedDataParallel should wrap `model`.

    Buffers stay out of its syncs: in plm models they are constants built alike on every process
    (position tables; ELMo's int16 character ids, a dtype neither gloo nor NCCL broadcasts). And DDP
    waits for a gradient of every parameter unless told that some may get none (ELMo's task-only
    scalar mix in pretraining, a finetuned encoder's pretraining heads). Telling it costs a graph
    traversal every step, so one forward/backward of the raw model on a first batch decides, with the
    random streams put back as they were; a process that found one (or had no batch) tells them all.
    """
    from accelerate.utils import DistributedDataParallelKwargs

    device = accelerator.device
    model.to(device)
    unused = batch is None
    if batch is not None:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            with accelerator.autocast():
                out = objective.step(model, to_device(batch, device), objective.init_state())
            out.loss.backward()
        unused = any(p.requires_grad and p.grad is None for p in model.parameters())
        model.zero_grad(set_to_none=True)
    unused = bool(accelerator.reduce(torch.tensor([float(unused)], device=device), reduction="sum").item())
    return DistributedDataParallelKwargs(broadcast_buffers=False, find_unused_parameters=unused)


def _resumable(loop: ckpt.LoopState, path: Path, accelerator, world: int, micro: int, global_batch: int) -> str | None:
    """Refuse a checkpoint this launch cannot continue; map its data position to this launch.

    Micro-batch k of rank r is global micro-batch k·world + r (data/batching.py), so after `step`
    optimizer steps exactly the first step × global_batch samples are consumed, whatever the number of
    processes or the micro batch: this launch continues at its micro-batch step × accum, the very next
    sample. With the same micro batch, every micro-batch keeps its global index and so its random draws:
    the run goes on as if it never stopped. Only DeepSpeed's partitioned state is tied to the process count
    that wrote it.
    """
    was_batch, was_world = loop.global_batch_size or global_batch, loop.world_size or world
    if was_batch != global_batch:
        raise PlmError(f"checkpoint {path} was trained with global batch {was_batch}, this run has {global_batch}",
                       f"resume with the same global batch: --set train.global_batch_size={was_batch}")
    loop.micro_batches = loop.step * global_batch // (micro * world)
    check_resume_world(accelerator, path, was_world, world)  # DeepSpeed only: FSDP's DCP shards reshard on load
    was_micro = loop.micro_batch_size or micro
    if was_world == world and was_micro == micro:
        return None
    same = ("the same steps as if it never stopped" if was_micro == micro else
            f"micro-batches of {micro}, not {was_micro}, so other dropout masks than an uninterrupted run's")
    return (f"resuming a {was_world}-process checkpoint with {world} process{'es' * (world > 1)}: the data continues "
            f"at sample {loop.step * global_batch:,}, where it stopped; {same}")


def _log_row(accelerator, loop, window, scheduler, grad_norm, fpt, peak) -> dict:
    keys = sorted(window["sums"])
    vec = accelerator.reduce(torch.stack([window["sums"][k] for k in keys] + [torch.as_tensor(window["count"]).float()
                                          .to(accelerator.device)]), reduction="sum")
    dt = max(time.perf_counter() - window["t0"], 1e-9)
    vec = vec.tolist()  # a logging step: the one place the host waits for the device's sums
    # Skipped steps add nothing: a window of only skipped steps has no mean to log.
    means = {k: vec[i] / vec[-1] for i, k in enumerate(keys)} if vec[-1] else {}
    row = {"step": loop.step, "tokens": loop.tokens, "elapsed_s": round(loop.elapsed, 3),
           "lr": scheduler.get_last_lr()[0], **means, "tok_per_s": window["tokens"] / dt}
    if grad_norm is not None:
        row["grad_norm"] = float(grad_norm)
    if fpt and peak:
        row["mfu"] = fpt * row["tok_per_s"] / (peak * accelerator.num_processes)
    window.update(t0=time.perf_counter(), tokens=0, sums={}, count=0.0)
    return row
