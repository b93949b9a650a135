"""How the benchmarks time steps and reduce the times to the numbers they report.

* A step's time on N ranks is the slower rank's (the step ends when the last rank is done).
* Configurations compared in one process step round-robin, the order rotated every round, so
  load from other processes on a shared host hits all of them alike.
* Medians over the measured steps (after warm-up); p10 is the 10th percentile, i.e. the
  fast end of the spread."""
from __future__ import annotations

import statistics
import time
import traceback


class PhaseClock:
    """Wall time of consecutive phases of one step: lap("forward") ends the phase that began at
    the previous lap (or at construction); skip() starts the next phase without timing the
    work since (bookkeeping that belongs to no phase). on_lap(phase), when given, runs after
    each lap (a memory probe); its time falls into the next phase."""

    def __init__(self, on_lap=None):
        self.laps = {}
        self._on_lap = on_lap
        self._start = time.perf_counter()

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        self.laps[phase] = now - self._start
        self._start = now
        if self._on_lap is not None:
            self._on_lap(phase)

    def skip(self) -> None:
        self._start = time.perf_counter()


def rotated(items: list, i: int) -> list:
    """items rotated by i: round i of a rotation, so no configuration has a fixed neighbour."""
    k = i % len(items)
    return items[k:] + items[:k]


def round_robin(steps: dict, rounds: int, warmup: int, failed: dict | None = None) -> dict:
    """Calls steps[name](i) for every name in round i, the order rotated each round. Returns,
    per name, (seconds, what the call returned) for every round after the warm-up ones. With
    `failed` given, a call that raises is recorded there (its traceback) and that name is left
    out from then on; without it, the exception propagates."""
    timed = {name: [] for name in steps}
    for i in range(rounds):
        for name in rotated(list(steps), i):
            if failed is not None and name in failed:
                continue
            t0 = time.perf_counter()
            try:
                value = steps[name](i)
            except Exception:  # noqa: BLE001 -- recorded when the caller asked for it
                if failed is None:
                    raise
                failed[name] = traceback.format_exc()
                continue
            elapsed = time.perf_counter() - t0
            if i >= warmup:
                timed[name].append((elapsed, value))
    return timed


def interleave_steps(steps: dict, batches: list, warmup: int, failed: dict | None = None) -> dict:
    """Trains every configuration round-robin, batch i in round i: steps[name](tokens,
    targets) -> (loss, {phase: seconds}). Returns, per name, {"total", *phases} for every
    round after the warm-up ones (failed: as in round_robin)."""
    timed = round_robin({name: (lambda i, step=step: step(*batches[i]))
                         for name, step in steps.items()}, len(batches), warmup, failed)
    return {name: [{"total": seconds, **phases} for seconds, (_, phases) in t]
            for name, t in timed.items()}


def median(values) -> float:
    """The median, nan when there is nothing to take it of."""
    values = list(values)
    return statistics.median(values) if values else float("nan")


def p10(values) -> float:
    values = sorted(values)
    return values[len(values) // 10]


def slowest_rank(rank_times: list[list[dict]], key: str = "total") -> list[float]:
    """rank_times: one list of per-step dicts per rank. Per step, the slower rank's seconds."""
    n = min(len(t) for t in rank_times)
    return [max(t[i][key] for t in rank_times) for i in range(n)]


def step_stats(rank_times: list[list[dict]]) -> dict:
    """Median and p10 (ms) of the slower rank's time per step, total and by phase."""
    out = {}
    for key in ("total", "forward", "backward", "step"):
        per_step = [s * 1e3 for s in slowest_rank(rank_times, key)]
        out[key] = {"median": statistics.median(per_step), "p10": p10(per_step)}
    out["steps"] = min(len(t) for t in rank_times)
    return out


def median_time(fn, steps: int, warm: int = 2) -> float:
    """Median seconds of `steps` calls of fn after `warm` unmeasured ones."""
    for _ in range(warm):
        fn()
    samples = []
    for _ in range(steps):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def collective_median(fn, repeats: int = 7) -> float:
    """Median seconds of a collective: one unmeasured call, then `repeats` calls, each after a
    barrier so that every rank starts it together."""
    import torch.distributed as dist

    fn()
    samples = []
    for _ in range(repeats):
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def measure_steps(step, batches, warmup: int, at_warmup_end=None, after_step=None):
    """Trains on every batch: step(tokens, targets) -> (loss, {phase: seconds}). Calls
    at_warmup_end() before the first measured step and after_step() after each (neither is
    timed). Returns the losses of every step and, per measured step, {"total", *phases}."""
    losses, times = [], []
    for i, (tokens, targets) in enumerate(batches):
        if i == warmup and at_warmup_end is not None:
            at_warmup_end()
        t0 = time.perf_counter()
        loss, phases = step(tokens, targets)
        elapsed = time.perf_counter() - t0
        losses.append(loss)
        if after_step is not None:
            after_step()
        if i >= warmup:
            times.append({"total": elapsed, **phases})
    return losses, times


def pool_rounds(results: list[dict], keys=("total", "forward", "backward", "step")):
    """One configuration run several times (rounds, repeats), each result with its ranks'
    step_times: per key, the slower rank's seconds of every measured step pooled over the
    rounds, and each round's median in ms (to show the round-to-round noise)."""
    pooled = {k: [] for k in keys}
    round_ms = {k: [] for k in keys}
    for result in results:
        rank_times = [r["step_times"] for r in result["ranks"]]
        for k in keys:
            per_step = slowest_rank(rank_times, k)
            pooled[k] += per_step
            round_ms[k].append(median(per_step) * 1e3)
    return pooled, round_ms


def median_per_rank(results: list[dict], value) -> list:
    """Per rank, the median over the rounds of value (a key of the rank's result, or a
    function of it)."""
    get = value if callable(value) else (lambda rank: rank[value])
    return [median(get(result["ranks"][k]) for result in results)
            for k in range(len(results[-1]["ranks"]))]


def engine_step(engine, tokens, targets, sync: bool = False, on_lap=None):
    """One training step of zero's engine, each phase timed: forward, engine.backward,
    (with sync, a barrier: the other rank's lag lands in "sync", not in step()) and
    engine.step(); on_lap as PhaseClock's. Returns (loss, {phase: seconds})."""
    clock = PhaseClock(on_lap)
    loss = engine(tokens, targets)
    clock.lap("forward")
    engine.backward(loss)
    clock.lap("backward")
    if sync:
        import torch.distributed as dist

        dist.barrier()
        clock.lap("sync")
    engine.step()
    clock.lap("step")
    return float(loss.detach()), clock.laps
