"""``schedsvc demo``: every experiment of the sources runs, is printed beside its claim, and is in the JSON.

The CLI runs use ``--quick`` (small sizes, a second or two); tests assert what
was measured and shown, never how fast anything was.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

import schedsvc as ss
from schedsvc.cli import demo, main
from tests.helpers import within

ALL_ROWS = [(title, row) for title, rows in demo.SECTIONS for row in rows]


def _positive(figures: dict[str, float]) -> bool:
    return bool(figures) and all(math.isfinite(v) and v > 0 for v in figures.values())


@pytest.fixture
def wide(monkeypatch: pytest.MonkeyPatch) -> None:
    """A console wide enough that no cell wraps, so every text can be found on one line."""
    monkeypatch.setenv("COLUMNS", "1000")
    monkeypatch.setattr(demo, "_MAX_WIDTH", 1000)


@pytest.mark.usefixtures("wide")
def test_demo_prints_every_section_and_row(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--quick", "--reps", "1"]) == 0
    out = capsys.readouterr().out
    assert "1 run, " in out and "quick sizes" in out
    for title, _ in demo.SECTIONS:
        assert title.upper() in out
    for _, row in ALL_ROWS:
        assert row.label.format(s=demo.QUICK) in out
        assert row.claim in out
    for figures in (
        "submit returned in",
        "awaited op by op",
        "N·t2",
        "1 worker",
        "peak",
        "faster than eager",
        "returns the constant 10",
        "same result bit for bit",
        "batched by the engine",
        "every row equal to the loop's bit for bit",
        "dependency arrows",
    ):
        assert figures in out
    reason = demo.gpu_unavailable("cuda:0")
    if reason is not None:
        assert out.count(f"skipped: {reason}") == 4


def test_demo_json_to_stdout_has_every_experiment(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--quick", "--reps", "1", "--json", "-"]) == 0
    report = json.loads(capsys.readouterr().out)  # nothing but the JSON on stdout
    assert report["reps"] == 1 and report["quick"] is True and report["blas_threads"] == 1
    experiments = report["experiments"]
    assert set(experiments) == set(demo.EXPERIMENTS) | set(demo.GPU_EXPERIMENTS)
    for key in demo.EXPERIMENTS:
        assert experiments[key]["status"] == "measured", key
        assert _positive(experiments[key]["figures"]), key
    assert [(r["section"], r["label"]) for r in report["rows"]] == [
        (title, row.label.format(s=demo.QUICK)) for title, row in ALL_ROWS
    ]
    for row in report["rows"]:
        assert row["claim"]
        assert row["measured"] if row["status"] == "measured" else row["reason"]


def test_demo_json_to_stdout_shows_progress_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    """`schedsvc demo --json -` used to print nothing at all for the 10-20 s the experiments take."""
    report = {"wall_s": 1.5, "experiments": {}}

    def run(reps: int, sizes: demo.Sizes, progress: Any) -> dict[str, Any]:  # the runs, not run
        for key in demo.EXPERIMENTS:
            progress(f"run 1/{reps}: {key}")
        return report

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(demo, "measure", run)
        patch.setattr(demo, "_with_rows", lambda report, sizes, quick: report)
        assert main(["demo", "--quick", "--reps", "1", "--json", "-"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out) == report  # stdout is still nothing but the JSON
    assert captured.err.splitlines() == [f"  ... run 1/1: {key}" for key in demo.EXPERIMENTS] + [
        "  ... all runs done in 1.5 s"
    ]


def test_demo_json_checks_what_the_runs_established(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--quick", "--reps", "1", "--json", "-"]) == 0
    e = json.loads(capsys.readouterr().out)["experiments"]
    s = demo.QUICK
    assert e["queued"]["checks"]["equals_numpy"] is True
    assert e["mlp"]["checks"] == {"compiled_equals_eager": True, "traces": 1}
    assert e["fancy"]["figures"]["eager_tasks_per_call"] == 3
    assert e["fancy"]["figures"]["compiled_tasks_per_call"] == 1
    assert e["fancy"]["checks"]["folded_value"] == 10 and e["fancy"]["checks"]["folded_kept_ops"] == 0
    assert e["serialise"]["checks"] == {"loaded_equals_compiled": True, "loaded_traces": 0}
    assert e["batching"]["checks"] == {"batched_equals_loop": True, "rows": s.row_calls}
    assert e["batching"]["figures"]["batches"] < s.row_calls  # the concurrent calls were batched
    profile = e["profile"]["figures"]
    assert profile["spans"] == s.trace_dots + 1 + s.trace_chain  # every task, once
    assert profile["flow_arrows"] == s.trace_dots + s.trace_chain  # each dot into the join, each link
    memory = e["memory"]["figures"]
    assert (
        memory["bounded_peak_mib"] <= memory["bound_mib"] + memory["batch_mib"]
    )  # the backpressure contract


def test_demo_on_a_cpu_only_machine_skips_the_gpu_rows_with_the_reason(
    capsys: pytest.CaptureFixture[str],
) -> None:
    reason = demo.gpu_unavailable("cuda:0")
    if reason is None:
        pytest.skip("this machine's engine runs cuda tasks")
    assert main(["demo", "--quick", "--reps", "1", "--json", "-"]) == 0
    report = json.loads(capsys.readouterr().out)
    for key in demo.GPU_EXPERIMENTS:
        assert report["experiments"][key] == {"status": "skipped", "reason": reason}
    gpu_rows = [r for r in report["rows"] if r["section"] == "GPU"]
    assert len(gpu_rows) == 4
    assert all(r["status"] == "skipped" and r["reason"] == reason and "measured" not in r for r in gpu_rows)


def test_gpu_found_but_engine_without_cuda_workers_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    """CuPy and a GPU present, but the engine cannot run cuda tasks: skipped with the engine's reason."""
    from schedsvc.devices import cuda

    async def not_built(cls: Any, rt: Any, name: str, config: Any) -> Any:
        raise ss.DeviceError(f"{name} is present, but this engine cannot run cuda tasks")

    monkeypatch.setattr(cuda, "check", lambda index, simulated=False: None)
    monkeypatch.setattr(cuda.CudaDevice, "open", classmethod(not_built))
    assert demo._skips() == {
        "gpu_queued": "cuda:0 is present, but this engine cannot run cuda tasks",
        "cpu_gpu": "cuda:0 is present, but this engine cannot run cuda tasks",
        "copy_overlap": "cuda:0 is present, but this engine cannot run cuda tasks",
        "multi_gpu": "cuda:0 is present, but this engine cannot run cuda tasks",
    }


def test_the_demo_table_fits_100_columns_without_colour_when_piped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    path = tmp_path / "demo.json"
    assert main(["demo", "--quick", "--reps", "1", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out
    assert max(len(line) for line in out.splitlines()) <= 100
    assert f"wrote {path}" in out
    assert json.loads(path.read_text())["rows"]


def test_demo_rejects_zero_reps(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--reps", "0"]) == 2
    assert "--reps must be at least 1" in capsys.readouterr().err


def test_figures_are_medians_over_the_runs_and_checks_come_from_the_last() -> None:
    runs: list[demo.Result] = [({"a_s": 3.0}, {"n": 1}), ({"a_s": 1.0}, {"n": 2}), ({"a_s": 2.0}, {"n": 3})]
    assert demo._summary(runs) == {
        "status": "measured",
        "figures": {"a_s": 2.0},
        "range": {"a_s": [1.0, 3.0]},
        "checks": {"n": 3},
    }


def test_simulated_cuda_devices_are_not_timed_as_if_real(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCHEDSVC_CUDA_SIMULATOR", "1")
    assert demo._skips() == dict.fromkeys(demo.GPU_EXPERIMENTS, demo.SIMULATED_SKIP)


async def test_the_sources_gpu_experiment_queues_then_finishes_on_the_simulator(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its own code on the CUDA simulator (which the demo itself never times): randn made on the device,
    the products queued, then waited for."""
    monkeypatch.setenv("SCHEDSVC_CUDA_SIMULATOR", "1")
    figures, checks = await within(demo.gpu_queued(demo.QUICK), 30)
    assert checks == {"device": "cuda:0"}
    assert 0 < figures["queue_s"] <= figures["finish_s"]
    assert figures["finish_over_queue"] == pytest.approx(figures["finish_s"] / figures["queue_s"])


async def test_gpu_experiments_run_on_a_cpu_stand_in() -> None:
    """The GPU experiments' own code, run with 'cpu' in place of each GPU (never shown by the demo)."""
    s = demo.QUICK
    for result in (
        await within(demo.cpu_gpu(s, gpu="cpu"), 30),
        await within(demo.copy_overlap(s, gpu="cpu"), 30),
        await within(demo.multi_gpu(s, gpus=("cpu",)), 30),
    ):
        figures, _ = result
        assert _positive(figures)
