"""``schedsvc bench gpu``: no GPU -> one line, exit 0, no figures; the simulated run's structure and labels.

No timing is asserted: the simulated figures time nothing real, and the real run is the gpu-marked test.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from schedsvc.cli import main
from schedsvc.cli.bench import gpu

CASES = {"G1", "G2", "G3", "G4", "G5", "G6"}


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, object]:
    assert main(["bench", "gpu", *argv, "--json", "-"]) == 0
    report: dict[str, object] = json.loads(capsys.readouterr().out)
    return report


def test_without_a_gpu_it_says_why_and_exits_0_with_no_figures(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gpu, "unavailable", lambda: "cuda:0 is unavailable: CuPy is not installed")
    assert _json(capsys) == {"gpu": None, "reason": "cuda:0 is unavailable: CuPy is not installed"}
    assert main(["bench", "gpu"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out == [
        "schedsvc bench gpu: no GPU here, nothing measured: cuda:0 is unavailable: CuPy is not installed"
    ]


def test_here_without_cupy_the_reason_is_the_engines(capsys: pytest.CaptureFixture[str]) -> None:
    if gpu.unavailable() is None:
        pytest.skip("this machine has a GPU")
    report = _json(capsys)
    assert set(report) == {"gpu", "reason"} and report["gpu"] is None
    assert "cuda:0" in str(report["reason"])


def test_the_simulated_run_has_every_case_labelled_not_real(capsys: pytest.CaptureFixture[str]) -> None:
    report = _json(capsys, "--simulate", "--reps", "1")
    assert report["simulated"] == gpu.SIMULATED_LABEL
    assert "simulated" in str(report["gpu"]) and report["reps"] == 1
    cases = report["cases"]
    assert isinstance(cases, dict) and set(cases) == CASES
    for name, case in cases.items():
        if not case["available"]:
            assert name == "G5", f"{name}: {case}"
            continue
        assert case["met"] is None, name  # a simulated figure meets or misses nothing
        assert case["engine"] > 0 and case["baseline"] > 0
        # one repetition: the ratio is that run's engine figure over its baseline
        assert case["ratio"] == pytest.approx(case["engine"] / case["baseline"]), name
        assert case["figures"][gpu.CASES[name].engine] == case["engine"]
    assert cases["G1"]["target"] == "<= 1.2" and cases["G4"]["target"] == "<= 0.7"
    assert cases["G2"]["target"] is None
    assert {"engine_queue_ms", "engine_finish_ms", "raw_queue_ms", "raw_finish_ms"} <= set(
        cases["G2"]["figures"]
    )
    assert {"watcher_p50_us", "watcher_p99_us", "raw_p50_us", "raw_p99_us"} <= set(cases["G6"]["figures"])
    assert cases["G6"]["missing"].startswith("host callbacks: not available")


def test_g5_times_the_compiled_mlp_replayed_as_cuda_graphs(capsys: pytest.CaptureFixture[str]) -> None:
    """Compile on cuda devices captures the MLP (graphs between its three cuBLAS matmuls): G5 measures it."""
    g5 = _json(capsys, "--simulate", "--reps", "2")["cases"]["G5"]  # type: ignore[index]
    assert g5["available"], g5
    assert g5["target"] == "<= 0.5" and g5["engine"] > 0 and g5["baseline"] > 0
    assert set(g5["figures"]) >= {"engine_us", "raw_us"}


def test_the_simulated_table_is_labelled_and_marks_no_target(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "gpu", "--simulate", "--reps", "1"]) == 0
    out = capsys.readouterr().out
    assert gpu.SIMULATED_LABEL in out
    rows = [
        line for line in out.splitlines() if line.lstrip().startswith(("G1", "G2", "G3", "G4", "G5", "G6"))
    ]
    assert len(rows) == 6 and all("[sim ]" in row for row in rows)
    assert "[met ]" not in out and "[MISS]" not in out


def test_simulate_is_for_the_gpu_suite_only(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "tensor", "--simulate"]) == 2
    assert "gpu suite only" in capsys.readouterr().err


def test_graphs_are_counted_from_the_cuda_graphs_counter() -> None:
    assert gpu.graphs_of({"traces": 1, "replays": 3, "signatures": 1, "evictions": 0}) == 0
    assert gpu.graphs_of({"traces": 1, "cuda_graphs": 2}) == 2


@pytest.mark.gpu
def test_on_a_real_gpu_every_case_runs_on_cupy() -> None:
    if (reason := gpu.unavailable()) is not None:
        pytest.skip(reason)
    report = gpu.run(reps=1, sizes=gpu.TINY)
    assert report["simulated"] is False and "CuPy" in report["backend"]
    for name, case in report["cases"].items():
        if case["available"]:
            assert case["engine"] > 0 and case["baseline"] > 0, name
            assert (case["met"] is None) == (case["target"] is None), name
        else:
            assert name == "G5" and case["reason"].startswith("not available: "), case


# -- scripts/gpu_probe.py: a GPU op's time by thread, and G3 repeated -------------------------------------

GPU_PROBE = Path(__file__).resolve().parents[3] / "scripts" / "gpu_probe.py"


def _gpu_probe(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(GPU_PROBE), *args], capture_output=True, text=True, timeout=120
    )


def test_gpu_probe_times_a_chain_of_ops_on_each_device() -> None:
    done = _gpu_probe("chain", "20", "--simulate")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [line.split(": ")[0] for line in lines] == ["cpu"] * 3 + ["cuda:0"] * 3
    assert all(re.fullmatch(r"\S+: queue [\d.]+ µs/op, finish [\d.]+ µs/op", line) for line in lines)


def test_gpu_probe_repeats_g3_with_its_figures() -> None:
    done = _gpu_probe("g3", "2", "--simulate")
    assert done.returncode == 0, done.stderr
    runs = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(runs) == 2
    for figures in runs:
        assert figures["ratio"] == pytest.approx(figures["engine_both_s"] / figures["longer_s"], rel=1e-3)


def test_gpu_probe_without_a_gpu_says_why() -> None:
    if gpu.unavailable() is None:
        pytest.skip("this machine has a GPU")
    done = _gpu_probe("chain", "20")
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith("no GPU to probe: cuda:0 is unavailable")


def test_gpu_probe_counts_the_engines_bytecodes_per_op_by_thread() -> None:
    done = _gpu_probe("ops", "20", "--simulate", "--top", "1")
    assert done.returncode == 0, done.stderr
    totals = [line for line in done.stdout.splitlines() if not line.startswith(" ")]
    assert [line.split(":")[0] for line in totals] == ["loop", "device", "watchers", "others"]
    engine = {line.split(":")[0]: int(line.split(", ")[1].split()[0].replace(",", "")) for line in totals}
    assert engine["loop"] > 100 and engine["watchers"] > 10  # queued and launched there; completed in bulk
    assert engine["device"] == 0  # a kind launched before is launched by the op's own call
    assert engine["others"] == 0  # the simulator's threads run none of the engine's code


# -- bench gpu --peers: the sources' workloads on schedsvc, raw CuPy, PyTorch and JAX -----------------------


def test_peers_on_the_simulator_measure_schedsvc_and_raw_cupy_and_check_their_results() -> None:
    from schedsvc.cli.bench import peers

    report = peers.run(reps=1, simulate=True, systems=("schedsvc", "cupy", "torch"))
    systems = report["systems"]
    assert systems["schedsvc"]["available"] and systems["cupy"]["available"]
    assert not systems["torch"]["available"] and systems["torch"]["reason"]  # never on the simulator
    assert report["checks"] == {"ok": True, "wrong": []}
    figures = report["figures"]
    assert set(figures["schedsvc"]) == {"p1", "p2", "p3", "p4", "p5"}
    assert set(figures["cupy"]) == {"p1", "p2", "p3", "p4", "p4b", "p5"}
    assert (
        figures["schedsvc"]["p4"]["batched_calls_per_s"] > 0
        and figures["cupy"]["p4b"]["batcher_calls_per_s"] > 0
    )
    for target in report["targets"]:
        assert target["met"] is None  # simulated: meets or misses nothing
        assert (target["ratio"] is None) == (target["label"].find("PyTorch") >= 0), target


def test_peers_check_fails_a_system_whose_results_differ() -> None:
    from schedsvc.cli.bench import peers
    from schedsvc.cli.bench._peer import TINY, reference

    good = {k: v for k, v in reference(TINY).items() if k != "p4b"}
    rounds = [
        {
            "schedsvc": {"available": True, "figures": {}, "checks": good},
            "cupy": {"available": True, "figures": {}, "checks": {**good, "p3": good["p3"] + 1.0}},
        }
    ]
    checks = peers._checks(rounds, ("schedsvc", "cupy"), {"schedsvc": True, "cupy": True}, TINY)
    assert not checks["ok"] and len(checks["wrong"]) == 1 and checks["wrong"][0].startswith("cupy p3")


def test_peers_table_names_what_was_not_measured(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "gpu", "--peers", "--simulate", "--reps", "1"]) == 0
    out = capsys.readouterr().out
    assert "simulated: not timed as real" in out
    assert re.search(r"torch: not measured: ", out) and re.search(r"jax: not measured: ", out)
    assert "every system agrees with the float64 reference" in out
    assert "[met ]" not in out and "[MISS]" not in out


def test_peers_is_for_the_gpu_suite_only(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "core", "--peers"]) == 2
    assert "--peers applies to the gpu suite only" in capsys.readouterr().err


async def test_the_hand_written_batcher_runs_the_calls_queued_meanwhile_as_one() -> None:
    import asyncio

    import numpy as np

    from schedsvc.cli.bench._peer import Batcher

    sizes: list[int] = []

    def run_rows(rows: np.ndarray) -> np.ndarray:
        sizes.append(len(rows))
        return rows * 2

    batcher = Batcher(run_rows)
    try:
        results = await asyncio.gather(*(batcher(np.full((1, 3), float(i))) for i in range(8)))
    finally:
        await batcher.close()
    assert sizes == [8]
    for i, got in enumerate(results):
        np.testing.assert_array_equal(got, np.full((1, 3), 2.0 * i))


@pytest.mark.gpu
def test_on_a_real_gpu_the_peers_run_and_agree() -> None:
    from schedsvc.cli.bench import peers

    if (reason := gpu.unavailable()) is not None:
        pytest.skip(reason)
    report = peers.run(reps=1, tiny=True)
    assert report["systems"]["schedsvc"]["available"] and report["systems"]["cupy"]["available"]
    assert report["checks"]["ok"], report["checks"]
