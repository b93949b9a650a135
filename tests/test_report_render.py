"""zero-mem report: the table and PNG timeline from real 2-process runs' JSON lines (stage 2,
and stage 3 with the optimizer on NVMe and the parameters on the host: one column per
location), the live table's location split, and the final report."""
import json
import os

import pytest

import training
from distributed_harness import run_distributed
from zero.reports import cli, render
from zero.reports.table import format_report, format_table

pytest.importorskip("matplotlib")
import matplotlib.image  # noqa: E402  (after the skip)


def _train_with_reports(rank, world, path, steps):
    import zero

    config = training.engine_config(2, gas=1, precision="bf16")
    config["memory_report"] = {"path": path, "every_n_steps": 1}
    engine, _, _, _ = zero.initialize(model=training.make_model(), config=config)
    training.train_engine(engine, rank, world, steps, 1)
    return sorted(engine.memory_report()["categories"])


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("run")
    categories = run_distributed(_train_with_reports, 2, args=(str(folder / "mem.jsonl"), 4))
    assert categories[0] == categories[1]
    return folder, categories[0]


def test_the_renderer_draws_every_rank_and_tabulates_every_category(run_dir, tmp_path, capsys):
    folder, categories = run_dir
    assert sorted(p.name for p in folder.iterdir()) == ["mem.rank0.jsonl", "mem.rank1.jsonl"]
    png = tmp_path / "memory.png"
    assert cli.main(["report", str(folder), "--png", str(png), "--table"]) == 0
    out = capsys.readouterr().out
    assert png.stat().st_size > 0
    image = matplotlib.image.imread(str(png))
    assert image.ndim == 3 and image.shape[0] > 200 and image.shape[1] > 200
    assert {"param", "gradient", "fp32_master", "optimizer_state", "bucket"} <= set(categories)
    lines = out.splitlines()
    for rank in (0, 1):
        for name in categories:
            assert any(line.startswith(f"rank {rank}") and f" {name} " in line
                       for line in lines), (rank, name)
    assert "2Ψ + 14Ψ/N" in out and "= formula" in out and "differs" not in out


def test_runs_appended_to_one_file_are_told_apart(run_dir, tmp_path):
    folder, _ = run_dir
    for rank in (0, 1):  # a second run appended to the same files
        text = (folder / f"mem.rank{rank}.jsonl").read_text()
        (tmp_path / f"mem.rank{rank}.jsonl").write_text(text + text + '{"rank": 0, "st')
    loaded = render.load([str(tmp_path)])
    assert [len(s.reports) for s in loaded.series] == [4, 4]
    assert any("2 runs" in w for w in loaded.warnings)
    assert any("not JSON" in w for w in loaded.warnings)  # the cut-short last line
    first = render.load([str(tmp_path)], run=0, ranks=[1])
    assert [s.rank for s in first.series] == [1]
    with pytest.raises(render.ReportError, match="holds 2 run"):
        render.load([str(tmp_path)], run=5)


def test_a_single_report_per_rank_still_draws(run_dir, tmp_path):
    folder, _ = run_dir
    report = json.loads((folder / "mem.rank0.jsonl").read_text().splitlines()[0])
    path = tmp_path / "one.rank0.jsonl"
    path.write_text(json.dumps(report) + "\n")
    png = tmp_path / "one.png"
    render.plot(render.load([str(path)]).series, str(png))
    assert matplotlib.image.imread(str(png)).shape[0] > 0


def test_missing_reports_are_a_clear_error(tmp_path, capsys):
    assert cli.main(["report", str(tmp_path)]) == 2
    assert "no *.rank<r>.jsonl" in capsys.readouterr().err


# ---- offload: the location split, the final report, the command line ---------------------------

STEPS = 4


def _train_offloaded(rank, world, path, nvme_path, steps, every):
    import zero

    config = training.engine_config(3, gas=2, precision="bf16",
                                    stage3_param_persistence_threshold=40,
                                    stage3_prefetch_bucket_size=13_000,
                                    stage3_max_reuse_distance=0)
    config["zero_optimization"].update(
        offload_optimizer={"device": "nvme", "nvme_path": nvme_path} if nvme_path else
        {"device": "cpu", "pin_memory": False},
        offload_param={"device": "cpu", "pin_memory": False})
    config["memory_report"] = {"path": path, "every_n_steps": every}
    engine, _, _, _ = zero.initialize(model=training.make_model(), config=config)
    training.train_engine(engine, rank, world, steps, 2)
    final = engine.final_memory_report()
    engine.destroy()
    assert engine.final_memory_report() is None  # nothing left to report once destroyed
    return final


@pytest.fixture(scope="module")
def offload_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("offload")
    swap = tmp_path_factory.mktemp("swap")
    finals = run_distributed(_train_offloaded, 2,
                             args=(str(folder / "mem.jsonl"), str(swap), STEPS, 1))
    return folder, finals


def test_the_report_command_renders_a_real_offloaded_run(offload_run, tmp_path):
    import subprocess
    import sys

    import numpy

    folder, finals = offload_run
    png = tmp_path / "offload.png"
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(render.__file__))))
    # `zero-mem report` as a user runs it (the console script is `python -m zero.reports.cli`)
    done = subprocess.run([sys.executable, "-m", "zero.reports.cli", "report", str(folder),
                           "--png", str(png), "--table"], capture_output=True, text=True,
                          cwd=str(tmp_path), env={**os.environ, "PYTHONPATH": root},
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"wrote {png}" in done.stdout and "zero-mem" not in done.stderr  # no warnings
    assert png.stat().st_size > 30_000
    image = matplotlib.image.imread(str(png))
    assert image.shape[0] > 500 and image.shape[1] > 1000  # 2 ranks x 3 locations
    pixels = image[..., :3].reshape(-1, 3)
    assert pixels.std() > 0.1 and len(numpy.unique(pixels.round(2), axis=0)) > 50
    table = done.stdout
    for header in ("device MiB", "host pinned MiB", "host pageable MiB", "NVMe MiB"):
        assert header in table
    assert "offload: optimizer on NVMe + parameters on the host" in table
    assert "staging" in table and "engine peak" in table and "differs" not in table
    # The final report (same step as the last periodic one) is folded into the run.
    loaded = render.load([str(folder)])
    assert [len(s.reports) for s in loaded.series] == [STEPS, STEPS] and not loaded.warnings
    assert all(s.last.get("final") for s in loaded.series)
    assert all(len((folder / f"mem.rank{r}.jsonl").read_text().splitlines()) == STEPS + 1
               for r in (0, 1))
    assert finals[0]["step"] == STEPS and finals[0]["final"]


def test_the_live_table_shows_where_memory_lives(offload_run):
    """The table a rank prints at the end of a run is zero-mem report's, for that rank."""
    _, finals = offload_run
    lines = format_report(finals[0]).splitlines()
    assert lines[0].endswith("offload: optimizer on NVMe + parameters on the host)")
    for column in ("category", "device MiB", "host pinned MiB", "host pageable MiB", "NVMe MiB",
                   "current MiB", "peak MiB", "formula MiB", "check"):
        assert column in lines[1]
    rows = {line.split()[0]: line.split()[1:] for line in lines[3:]}
    # param: the persistent part on the device, the partitioned shard in pageable host memory
    device, pinned, pageable, nvme = rows["param"][:4]
    assert float(device) > 0 and pinned == "-" and float(pageable) > 0 and nvme == "-"
    assert rows["fp32_master"][0] == "-" and float(rows["fp32_master"][3]) > 0  # on NVMe
    model_states = next(line for line in lines if line.startswith("model states"))
    assert model_states.endswith("= formula")  # in all and at each location
    engine_peak = next(line for line in lines if line.startswith("engine peak"))
    assert engine_peak.endswith("(peak of each sum)")
    assert "process" in rows and not any(line.startswith("CUDA") for line in lines)  # a CPU run
    locations = finals[0]["by_location"]
    assert locations["nvme"]["current"] > 0 and locations["host_pageable"]["current"] > 0
    assert locations["device"]["peak"] > locations["device"]["current"]  # gathers, staging


def test_a_gpu_report_shows_the_allocator_peaks():
    report = {"rank": 1, "step": 3, "stage": 2, "world_size": 2, "numel": 1000,
              "param_bytes": 2, "model_state_bytes": 0, "model_state_expected_bytes": 0,
              "model_state_formula": "2Ψ + 14Ψ/N", "categories": {},
              "total": {"current": 0, "peak": 0},
              "process": {"rss_bytes": 2 << 30, "rss_peak_bytes": 3 << 30, "cuda_device": 1,
                          "cuda_allocated_bytes": 5 << 30, "cuda_max_allocated_bytes": 7 << 30,
                          "cuda_reserved_bytes": 8 << 30, "cuda_max_reserved_bytes": 9 << 30,
                          "cuda_outside_zero_bytes": 64 << 20}}
    lines = format_report(report).splitlines()
    assert "current MiB" in lines[1] and "peak MiB" in lines[1]  # the engine's unit
    rows = {" ".join(line.split()[:2]): line.split()[2:] for line in lines[3:-1]}
    assert rows["CUDA allocated"] == ["5120.000", "5120.000", "7168.000", "(allocator)"]
    assert rows["CUDA reserved"] == ["8192.000", "8192.000", "9216.000", "(allocator)"]
    assert rows["process RSS"] == ["2048.000", "3072.000", "(whole", "process)"]
    assert lines[-1] == ("CUDA allocated (cuda:1): 64.000 MiB of it outside zero's accounting "
                         "(activations, cuBLAS workspaces, the script's own tensors)")


def test_model_states_off_the_formula_name_each_location_against_it():
    report = {"rank": 0, "step": 1, "stage": 2, "world_size": 2, "numel": 1 << 20,
              "param_bytes": 2, "model_state_bytes": 9 << 20, "model_state_expected_bytes":
              9 << 20, "model_state_formula": "2Ψ + 14Ψ/N", "categories": {},
              "total": {"current": 9 << 20, "peak": 9 << 20},
              "model_state_by_location": {"measured": {"device": 3 << 20, "host": 6 << 20},
                                          "expected": {"device": 2 << 20, "host": 7 << 20}}}
    lines = format_report(report).splitlines()
    assert next(line for line in lines if line.startswith("model states")).endswith("differs")
    assert lines[-1] == ("model states by location (peak): device 3.000 MiB (formula 2.000 MiB), "
                         "host 6.000 MiB (formula 7.000 MiB)")


def test_model_states_now_and_at_their_most_each_in_its_column():
    """After a stage-2 step the gradient shard is given back: the row's locations and current
    sum are what is held now, its peak (the categories' peaks) is what the formula counts."""
    mib = 1 << 20
    report = {"rank": 0, "step": 1, "stage": 2, "world_size": 2, "numel": 1 << 20,
              "param_bytes": 2, "model_state_bytes": 9 * mib, "model_state_expected_bytes":
              9 * mib, "model_state_formula": "2Ψ + 14Ψ/N",
              "categories": {
                  "param": {"current": 2 * mib, "peak": 2 * mib,
                            "by_location": {"device": {"current": 2 * mib, "peak": 2 * mib}}},
                  "gradient": {"current": 0, "peak": 1 * mib,
                               "by_location": {"device": {"current": 0, "peak": 1 * mib}}},
                  "optimizer_state": {"current": 6 * mib, "peak": 6 * mib, "by_location": {
                      "device": {"current": 6 * mib, "peak": 6 * mib}}}},
              "total": {"current": 8 * mib, "peak": 9 * mib}}
    row = next(line for line in format_report(report).splitlines()
               if line.startswith("model states")).split()
    device, current, peak, formula = row[2], row[6], row[7], row[8]
    assert (device, current, peak, formula) == ("8.000", "8.000", "9.000", "9.000")
    assert row[-2:] == ["=", "formula"]


def _reports_without_an_interval(rank, world, path):
    import zero

    config = training.engine_config(1, gas=1, precision="bf16")
    config["memory_report"] = {"path": path}  # every_n_steps: steps_per_print, unset here
    engine, _, _, _ = zero.initialize(model=training.make_model(), config=config)
    training.train_engine(engine, rank, world, 2, 1)
    before = os.path.exists(path.replace(".jsonl", f".rank{rank}.jsonl"))
    engine.final_memory_report()
    engine.destroy()
    return before


def test_a_path_without_an_interval_writes_only_the_final_report(tmp_path):
    path = str(tmp_path / "mem.jsonl")
    assert run_distributed(_reports_without_an_interval, 2, args=(path,)) == [False, False]
    loaded = render.load([str(tmp_path)])
    assert [len(s.reports) for s in loaded.series] == [1, 1]
    assert all(s.last["final"] and s.last["step"] == 2 for s in loaded.series)


def test_reports_written_before_the_location_keys_still_render(run_dir, tmp_path):
    folder, _ = run_dir
    for rank in (0, 1):
        lines = []
        for line in (folder / f"mem.rank{rank}.jsonl").read_text().splitlines():
            report = json.loads(line)
            for key in ("by_location", "model_state_by_location", "offload"):
                report.pop(key, None)
            lines.append(json.dumps(report))
        (tmp_path / f"old.rank{rank}.jsonl").write_text("\n".join(lines) + "\n")
    loaded = render.load([str(tmp_path)])
    table = format_table(loaded.last_reports())
    assert "= formula" in table and "differs" not in table
    png = tmp_path / "old.png"
    render.plot(loaded.series, str(png))
    assert matplotlib.image.imread(str(png)).shape[0] > 200


def test_the_title_names_where_each_offloaded_state_lives():
    from zero.reports.table import offload_text

    assert offload_text({"offload": {"optimizer": "cpu", "param": "nvme"}}) == \
        ", offload: optimizer on the host + parameters on NVMe"
    assert offload_text({"offload": {"optimizer": "nvme", "param": "cpu"}}) == \
        ", offload: optimizer on NVMe + parameters on the host"
    assert offload_text({"offload": {"optimizer": "none", "param": "none"}}) == ""
