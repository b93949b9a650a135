"""Progress bars for the waits without output (offload/progress.py): the bytes written to NVMe swap
files at start-up and while a checkpoint loads into them, the phases of the first step. Drawn on rank 0 only, and only when
stderr reaches a terminal (here: the launcher's word for it, ZERO_CONSOLE_IS_TTY)."""
import re

import pytest

import training
from distributed_harness import run_distributed
from test_offload import GAS, _config
from test_offload_param_nvme import _nvme_params, _swap_dirs

WRITING = re.compile(r"zero: writing NVMe swap files: ([\d.]+)([kMG]?)B ")
LOADING = re.compile(r"zero: loading the checkpoint into NVMe swap files: ([\d.]+)([kMG]?)B ")


def _stderr_of_build_and_load(rank, world, config, save_dir, console_is_tty):
    import io
    import os
    import sys

    import zero
    import offload.progress

    offload.progress.DELAY_SECONDS = 0   # the test's writes are far shorter than the real delay
    if console_is_tty:
        os.environ["ZERO_CONSOLE_IS_TTY"] = "1"
    captured, real = io.StringIO(), sys.stderr
    sys.stderr = captured
    try:
        engine, _, _, _ = zero.initialize(model=training.make_model(), config=config)
        training.train_engine(engine, rank, world, 1, GAS)
        engine.save_checkpoint(save_dir)
        engine.load_checkpoint(save_dir)
        engine.destroy()
    finally:
        sys.stderr = real
    return captured.getvalue()


def _amount(match):
    return float(match[1]) * {"": 1, "k": 1 << 10, "M": 1 << 20, "G": 1 << 30}[match[2]]


def test_optimizer_swap_writes_are_drawn_on_rank_0_at_start_up_and_load(tmp_path):
    swap, save = _swap_dirs(tmp_path, "swap", "ckpt")
    out = run_distributed(_stderr_of_build_and_load, 2,
                          args=(_config(2, swap, tile=1000), save, True), timeout=180)
    for pattern in (WRITING, LOADING):
        drawn = [pattern.search(line) for line in out[0].splitlines()]
        assert any(m and _amount(m) > 0 for m in drawn), out[0]
    assert "swap files" not in out[1]


def test_parameter_swap_writes_are_drawn_at_start_up(tmp_path):
    swap, save = _swap_dirs(tmp_path, "params", "ckpt")
    config = _nvme_params(_config(3, "cpu", tile=1000), swap, buffer_count=2)
    out = run_distributed(_stderr_of_build_and_load, 1, args=(config, save, True), timeout=180)
    assert any((m := WRITING.search(line)) and _amount(m) > 0 for line in out[0].splitlines()), \
        out[0]


@pytest.mark.parametrize("nvme, console_is_tty", [(True, False), (False, True)])
def test_no_bar_without_a_terminal_or_without_nvme(tmp_path, nvme, console_is_tty):
    swap, save = _swap_dirs(tmp_path, "swap", "ckpt")
    config = _config(2, swap if nvme else "cpu")
    out = run_distributed(_stderr_of_build_and_load, 1, args=(config, save, console_is_tty),
                          timeout=180)
    assert "swap files" not in out[0]


FIRST_STEP = re.compile(r"zero: first step \(state on NVMe\): (\d+) phases .*, (forward|backward|step)\]")


def _stderr_of_two_steps(rank, world, config):
    import io
    import sys

    import zero
    import offload.progress

    offload.progress.DELAY_SECONDS = 0
    captured, real = io.StringIO(), sys.stderr
    sys.stderr = captured
    try:
        engine, _, _, _ = zero.initialize(model=training.make_model(), config=config)
        training.train_engine(engine, rank, world, 1, GAS)
        after_first = captured.getvalue()
        training.train_engine(engine, rank, world, 1, GAS, first_step=1)
        engine.destroy()
    finally:
        sys.stderr = real
    return after_first, captured.getvalue()[len(after_first):]


def test_the_first_step_with_state_on_nvme_shows_its_phases_until_the_optimizer_stepped(tmp_path):
    (swap,) = _swap_dirs(tmp_path, "params")
    config = _nvme_params(_config(3, "cpu", tile=1000), swap, buffer_count=2)
    first, second = run_distributed(_stderr_of_two_steps, 1, args=(config,), timeout=180,
                                    env={"ZERO_CONSOLE_IS_TTY": "1"})[0]
    drawn = [m for line in re.split(r"[\r\n]", first) if (m := FIRST_STEP.search(line))]
    # GAS micro-batches of forward, backward and step each, the last one ending the step
    assert drawn and int(drawn[-1][1]) == 3 * GAS and drawn[-1][2] == "step", first
    assert {m[2] for m in drawn} == {"forward", "backward", "step"}
    assert "first step" not in second
