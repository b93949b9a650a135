"""zero-mem report: the table and PNG timeline from a real 2-process run's JSON lines."""
import json

import pytest

import training
from distributed_harness import run_distributed
from zero.reports import cli, render

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
