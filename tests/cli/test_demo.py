"""``schedsvc demo``: every experiment of the sources runs, is printed beside its claim, and is in the JSON.

The CLI runs use ``--quick`` (small sizes, a second or two); tests assert what
was measured and shown, never how fast anything was.
"""

from __future__ import annotations

import json
import math
import re
import statistics
import sys
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
        "every row equal to the loop's within rounding",
        "dependency arrows",
        "claims met: ",
    ):
        assert figures in out
    reason = demo.gpu_unavailable("cuda:0")
    if reason is not None:  # said once, above the rows it skips
        assert out.count(reason) == 1
        assert out.count("skipped: see above") == 4


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
        if row["status"] == "measured":  # each measured claim met or missed
            assert row["verdict"]["text"].startswith("met: " if row["verdict"]["met"] else "missed: ")
    assert report["load"]["cores"] >= 1 and set(report["load"]) == {"before", "after", "cores"}


def test_demo_json_to_stdout_shows_progress_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    """With the JSON on stdout, progress still shows on stderr: a line per run, and one when all are done."""
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
    assert e["batching"]["checks"] == {"batched_close_to_loop": True, "rows": s.row_calls}
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


# -- the printed ratios agree with the printed figures --------------------------------------------------------

_NUMBER = r"[\d,]+(?:\.\d+)?"
_TIME = rf"{_NUMBER} (?:µs|ms|s)"
_UNITS = {"µs": 1e-6, "ms": 1e-3, "s": 1.0, "": 1.0}

#: experiment -> patterns of its rows' "measured here" text: each names a printed ratio ``r`` and the
#: printed figures it is made of (``a`` over ``b``; ``c`` is added to ``a`` where the ratio is a sum's)
RATIO_PATTERNS: dict[str, list[str]] = {
    "loop": [
        rf"awaited op by op: (?P<a>{_TIME}) .*queued, then one wait: (?P<b>{_TIME}), (?P<r>{_NUMBER})x faster"
    ],
    "parallel": [rf"1 worker (?P<a>{_TIME}), \d+ workers (?P<b>{_TIME}): (?P<r>{_NUMBER})x"],
    "mlp": [
        rf"eager (?P<a>{_NUMBER}) µs; compiled (?P<b>{_NUMBER}) µs: (?P<r>{_NUMBER})x faster than eager",
        rf"NumPy (?P<b>{_NUMBER}) µs/call; .* compiled (?P<a>{_NUMBER}) µs: .*, (?P<r>{_NUMBER})x NumPy's time",
    ],
    "fancy": [
        rf"eager: 3 tasks, (?P<a>{_NUMBER}) µs per call; compiled: 1 task, (?P<b>{_NUMBER}) µs \((?P<r>{_NUMBER})x\)"
    ],
    "batching": [
        rf"a row at a time: (?P<a>{_NUMBER}) µs/row; batched by the engine: (?P<b>{_NUMBER}) µs/row, "
        rf"(?P<r>{_NUMBER})x the loop's throughput",
        rf"in (?P<b>{_NUMBER}) batches \((?P<r>{_NUMBER}) rows each on average\)",  # a: the rows, from checks
    ],
    "gpu_queued": [
        rf"queued in (?P<b>{_TIME}), finished after (?P<a>{_TIME}) \((?P<r>{_NUMBER})x the time to queue\)"
    ],
    "cpu_gpu": [
        rf"CPU alone (?P<a>{_TIME}), GPU alone (?P<c>{_TIME}), both queued together (?P<b>{_TIME}) "
        rf"\((?P<r>{_NUMBER})x less than one after the other\)"
    ],
    "copy_overlap": [rf"in turn (?P<a>{_TIME}); all queued (?P<b>{_TIME}) \((?P<r>{_NUMBER})x\)"],
    "multi_gpu": [rf"1 GPU (?P<a>{_TIME}), \d+ GPUs (?P<b>{_TIME}): (?P<r>{_NUMBER})x"],
}


def _printed(text: str) -> tuple[float, float]:
    """The interval of values a printed figure stands for ("1.37" is 1.365..1.375), in seconds for a time."""
    number, _, unit = text.partition(" ")
    digits = number.replace(",", "")
    half = 0.5 * 10.0 ** -len(digits.partition(".")[2])
    scale = _UNITS[unit]
    return (float(digits) - half) * scale, (float(digits) + half) * scale


def _agrees(ratio: str, a: tuple[float, float], b: tuple[float, float]) -> bool:
    """Could the printed ratio be a over b, for values that print as a and b?"""
    lo, hi = _printed(ratio)
    return lo <= a[1] / b[0] and a[0] / b[1] <= hi


def _check_ratios(row: dict[str, Any], checks: dict[str, Any]) -> int:
    """Assert each ratio a row prints agrees with the figures printed beside it; how many it printed."""
    found = 0
    for pattern in RATIO_PATTERNS.get(row["experiment"], []):
        match = re.search(pattern, row["measured"])
        if match is None:
            continue
        parts = match.groupdict()
        a = _printed(parts["a"]) if parts.get("a") else (checks["rows"], checks["rows"])
        if parts.get("c"):
            c = _printed(parts["c"])
            a = (a[0] + c[0], a[1] + c[1])
        assert _agrees(parts["r"], a, _printed(parts["b"])), (row["label"], row["measured"], parts)
        found += 1
    return found


def _check_memory_ratios(rows: list[dict[str, Any]]) -> int:
    """The memory rows: "(Nx the time without a limit)" against the time of the row without a limit."""
    memory = [r for r in rows if r["experiment"] == "memory"]
    unbounded = re.search(rf"peak {_NUMBER} MiB, (?P<t>{_TIME})$", memory[0]["measured"])
    assert unbounded is not None, memory[0]["measured"]
    found = 0
    for row in memory[1:]:
        match = re.search(
            rf", (?P<t>{_TIME}) \((?P<r>{_NUMBER})x the time without a limit\)", row["measured"]
        )
        assert match is not None, row["measured"]
        assert _agrees(match["r"], _printed(match["t"]), _printed(unbounded["t"])), row["measured"]
        found += 1
    return found


def test_every_printed_ratio_agrees_with_the_times_printed_beside_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Each ratio a row prints is the ratio of the times printed beside it (both medians over the runs),
    never the median of the runs' own ratios.  Three runs, so that medians are taken."""
    assert main(["demo", "--quick", "--reps", "3", "--json", "-"]) == 0
    report = json.loads(capsys.readouterr().out)
    measured = [r for r in report["rows"] if r["status"] == "measured"]
    found = sum(_check_ratios(r, report["experiments"][r["experiment"]]["checks"]) for r in measured)
    found += _check_memory_ratios(measured)
    gpu_rows = sum(1 for r in measured if r["experiment"] in demo.GPU_EXPERIMENTS)
    assert found == 10 + gpu_rows  # loop 1, parallel 2, memory 2, mlp 2, fancy 1, batching 2; a GPU row's 1


#: raw figures of the GPU experiments (not run here), for the formatting test below
_GPU_RESULTS: dict[str, demo.Result] = {
    "gpu_queued": ({"queue_s": 0.002, "finish_s": 0.05}, {"device": "cuda:0"}),
    "cpu_gpu": ({"cpu_s": 0.4, "gpu_s": 0.1, "both_s": 0.42}, {"device": "cuda:0"}),
    "copy_overlap": ({"serial_s": 0.3, "overlapped_s": 0.12}, {"device": "cuda:0"}),
    "multi_gpu": ({"one_s": 0.2, "all_s": 0.11}, {"devices": ["cuda:0", "cuda:1"]}),
}


def _scrambled_runs(figures: dict[str, float], checks: dict[str, Any]) -> list[demo.Result]:
    """Three runs of an experiment whose figures vary each in its own order around the given values (their
    medians), so that the median of the runs' own ratios of two figures is not the ratio of their medians."""
    factors = [(1.0, 1.237, 0.619), (1.506, 1.0, 0.96), (1.3, 0.62, 1.0)]  # one median 1.0 each
    raw = [(k, v) for k, v in figures.items() if k not in demo.DERIVED]
    runs: list[demo.Result] = []
    for run in range(3):
        scaled = {k: v if k == "rows" else v * factors[i % 3][run] for i, (k, v) in enumerate(raw)}
        runs.append((demo.derived(scaled), checks))
    return runs


def test_ratios_are_computed_from_the_medians_of_their_figures() -> None:
    """Runs of 485, 600 and 300 ms against 533, 354 and 340 ms: 485 ms against 354 ms is 1.37x (the runs'
    own ratios have a median of 0.91x)."""
    runs: list[demo.Result] = [
        (demo.derived({"one_s": one, "all_s": all_}), {})
        for one, all_ in ((0.485, 0.533), (0.6, 0.354), (0.3, 0.34))
    ]
    summary = demo._summary(runs)
    assert summary["figures"] == {"one_s": 0.485, "all_s": 0.354, "speedup": pytest.approx(0.485 / 0.354)}
    assert summary["range"]["speedup"] == [pytest.approx(0.3 / 0.34), pytest.approx(0.6 / 0.354)]


def test_every_row_prints_ratios_that_agree_with_its_figures_over_scrambled_runs() -> None:
    """Every row's formatter, GPU rows included, fed the medians of runs that disagree with each other."""
    results = dict(_GPU_RESULTS)
    results["parallel"] = (
        demo.derived(
            {
                "independent_1worker_s": 0.4,
                "independent_nworkers_s": 0.25,
                "chain_1worker_s": 0.3,
                "chain_nworkers_s": 0.31,
            }
        ),
        {"workers": 2, "dots": 8},
    )
    results["mlp"] = (demo.derived({"numpy_us": 40.0, "eager_us": 300.0, "compiled_us": 60.0}), {})
    results["fancy"] = (
        demo.derived(
            {
                "eager_us": 120.0,
                "eager_tasks_per_call": 3.0,
                "compiled_us": 15.0,
                "compiled_tasks_per_call": 1.0,
                "folded_us": 9.0,
            }
        ),
        {"folded_value": 10.0, "folded_traced_ops": 7, "folded_ops": 7, "folded_kept_ops": 0},
    )
    results["batching"] = (
        demo.derived({"loop_us": 26.0, "batched_us": 19.0, "batches": 7.0, "rows": 300.0}),
        {"batched_close_to_loop": True, "rows": 300},
    )
    results["loop"] = (
        demo.derived(
            {
                "awaited_us": 300.0,
                "awaited_ms": 30.0,
                "queued_us": 30.0,
                "queued_ms": 3.0,
                "awaited_inline_us": 50.0,
                "t1_us": 10.0,
                "t2_us": 20.0,
                "t3_us": 270.0,
                "queued_t1_us": 5.0,
                "queued_t2_us": 25.0,
                "queued_t3_us": 400.0,
                "queued_frontend_ms": 0.5,
            }
        ),
        {"ops": 100},
    )
    found = 0
    for experiment, (figures, checks) in results.items():
        runs = _scrambled_runs(figures, checks)
        summary = demo._summary(runs)
        # the runs' own ratios disagree (but for rows per batch: the rows are the same in every run)
        for name in demo.DERIVED.keys() & summary["figures"].keys() - {"rows_per_batch"}:
            assert statistics.median(f[name] for f, _ in runs) != pytest.approx(
                summary["figures"][name], rel=0.05
            )
        for _, row in ALL_ROWS:
            if row.experiment != experiment:
                continue
            text = row.measured(summary["figures"], summary["checks"], demo.QUICK)
            found += _check_ratios({"experiment": experiment, "label": row.label, "measured": text}, checks)
    assert found == 12  # loop 1, parallel 2, mlp 2, fancy 1, batching 2, and one in each of the 4 GPU rows


# -- without the cli extra ------------------------------------------------------------------------------------


@pytest.fixture
def without_rich(monkeypatch: pytest.MonkeyPatch) -> None:
    """rich not installed (the cli extra left out): ``import rich`` fails."""
    monkeypatch.setitem(sys.modules, "rich", None)


@pytest.mark.usefixtures("without_rich")
def test_without_rich_the_demo_prints_plain_text_and_progress_lines(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["demo", "--quick", "--reps", "1"]) == 0
    captured = capsys.readouterr()
    out = captured.out
    assert out.startswith(
        'schedsvc demo: schedsvc\'s experiments on the claims of the "Computational Performance"'
    )
    assert "Dive into Deep Learning" in out
    assert not any(box in out for box in "─━│┃")
    assert max(len(line) for line in out.splitlines()) <= 100
    for title, rows in demo.SECTIONS:
        assert title.upper() in out.splitlines()
        for row in rows:
            assert row.label.format(s=demo.QUICK) in out.splitlines()
    flat = " ".join(out.split())  # the text is wrapped at 100 columns
    for _, row in ALL_ROWS:
        assert " ".join(row.claim.split()) in flat
    skipped = demo._skips()
    judged = [row for _, row in ALL_ROWS if row.target is not None and row.experiment not in skipped]
    verdicts = [line for line in out.splitlines() if line.startswith("    verdict:       ")]
    assert len(verdicts) == len(judged)  # a verdict under each row of an experiment that ran
    # the long experiments say which part runs now
    for part in ("parallel: independent dots on 1 worker", "memory: 12 batches, max_pending_bytes"):
        assert f"  ... run 1/1: {part}" in captured.err.splitlines()
    reason = demo.gpu_unavailable("cuda:0")
    if reason is not None:
        assert flat.count(" ".join(reason.split())) == 1


def test_without_threadpoolctl_the_demo_says_to_install_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "threadpoolctl", None)
    assert main(["demo", "--quick", "--reps", "1"]) == 2
    err = capsys.readouterr().err
    assert (
        "schedsvc demo: measuring holds BLAS at one thread with threadpoolctl, which is not installed "
        "(schedsvc needs it); " in err
    )
    assert err.rstrip().endswith("pip install 'threadpoolctl>=3.1'")


# -- the footer, and a figure missing ----------------------------------------------------------------------------

LOADED = {"before": 3.1, "after": 3.4, "cores": 2}


def test_the_footer_counts_the_claims_met_and_gives_the_load() -> None:
    rows: list[dict[str, Any]] = [
        {"verdict": {"met": True}},
        {"verdict": {"met": False}},
        {"status": "skipped"},
    ]
    report = {"rows": rows, "load": LOADED, "wall_s": 9.5}
    assert demo._footer(report) == (
        "claims met: 1 of 2 measured; load average 3.1 as the runs began, 3.4 as they ended, on 2 cores "
        "(loaded); took 9.5 s; schedsvc demo --json PATH writes every figure"
    )
    report["load"] = {"before": None, "after": None, "cores": 1}
    assert demo._footer(report).startswith("claims met: 1 of 2 measured; 1 core; took 9.5 s")
    rows.append({"verdict": {"met": None}})  # a figure its target needs was not measured
    assert demo._footer(report).startswith("claims met: 1 of 2 measured, 1 without a verdict; 1 core")


def _with_memory_figures(monkeypatch: pytest.MonkeyPatch, figures: dict[str, float]) -> None:
    """The runs, not run: the memory experiment measured ``figures``, every other one skipped."""
    experiments: dict[str, Any] = {
        key: {"status": "skipped", "reason": "not run in this test"}
        for key in (*demo.EXPERIMENTS, *demo.GPU_EXPERIMENTS)
    }
    experiments["memory"] = {"status": "measured", "figures": figures, "range": {}, "checks": {}}
    report = {"reps": 1, "cpu_workers": 2, "blas_threads": 1, "experiments": experiments, "wall_s": 1.0}
    report["load"] = {"before": 0.1, "after": 0.1, "cores": 2}
    monkeypatch.setattr(demo, "measure", lambda reps, sizes, progress: report)


@pytest.mark.parametrize("output", ["json", "rich", "plain"])
def test_a_figure_not_measured_is_named_instead_of_ending_the_demo(
    output: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """After every run, a figure that a row shows or its target needs and the runs did not give is said to
    be not measured, and the rest is reported."""
    monkeypatch.setenv("COLUMNS", "1000")
    monkeypatch.setattr(demo, "_MAX_WIDTH", 1000)
    if output == "plain":
        monkeypatch.setitem(sys.modules, "rich", None)
    peaks = {"unbounded_peak_mib": 30.0, "bounded_peak_mib": 9.0, "synced_peak_mib": 5.0}
    times = {"unbounded_s": 0.2, "bounded_s": 0.3, "synced_s": 0.4}
    _with_memory_figures(monkeypatch, demo.derived(peaks | times | {"batch_mib": 2.0}))  # no bound_mib
    assert main(["demo", "--quick", "--json", "-"] if output == "json" else ["demo", "--quick"]) == 0
    out = capsys.readouterr().out
    if output == "json":
        rows = [r for r in json.loads(out)["rows"] if r["experiment"] == "memory"]
        assert [r["verdict"] for r in rows] == [
            {"met": True, "text": "met: peak / the bounded run's 3.33x ≥ 2.00x"},
            {"met": None, "text": "no verdict: bound_mib not measured"},
            {"met": True, "text": "met: peak 5 MiB ≤ 6 MiB (three batches)"},
        ]
    else:
        assert "no verdict: bound_mib not measured" in out
        assert "claims met: 2 of 2 measured, 1 without a verdict" in out


def test_a_figure_a_row_shows_that_was_not_measured_is_named(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _with_memory_figures(monkeypatch, {"bounded_peak_mib": 9.0})
    assert main(["demo", "--quick", "--json", "-"]) == 0
    rows = [r for r in json.loads(capsys.readouterr().out)["rows"] if r["experiment"] == "memory"]
    assert [r["measured"] for r in rows] == [
        "not shown: unbounded_peak_mib not measured",
        "not shown: bounded_s not measured",
        "not shown: synced_peak_mib not measured",
    ]
    assert [r["verdict"]["text"] for r in rows] == [
        "no verdict: unbounded_over_bounded_peak not measured",
        "no verdict: bound_mib not measured",
        "no verdict: synced_peak_mib not measured",
    ]
