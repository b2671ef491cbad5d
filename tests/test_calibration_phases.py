"""``jitflops calibrate`` in phases: each number the median of its phases', so that a slow stretch of
a shared machine, which covers a family's whole timing, moves none of them."""

from __future__ import annotations

import functools
import json
from typing import Optional

import pytest

from jitflops.cli import main
from jitflops.estimates.devices import DeviceSpec
from jitflops.estimates.measured_curves import ProductGrid
from jitflops.timing import calibration
from jitflops.timing.calibration.phases import median_spec
from jitflops.timing.calibration.products import measured_grid


def _phase(rate: float, op_s: float, softmax: tuple[tuple[float, float], ...], emulated: tuple[str, ...] = (),
           grid: Optional[ProductGrid] = None) -> DeviceSpec:
    grid = grid or ProductGrid((1, 8), (1024, 4096), ((rate / 8, rate / 4), (rate / 2, rate)))
    return DeviceSpec(name="cpu (2 threads)", peak_flops={"float32": rate}, memory_bandwidth=4e10, compute_efficiency=1.0, memory_efficiency=1.0,
                      products={"float32": grid}, kernel_curves={"softmax": softmax}, host_s={"op": op_s, "module": 1e-6}, launch_s=op_s,
                      emulated=emulated)


def test_each_number_is_the_median_of_the_phases_that_measured_it():
    """A phase in a slow stretch (products at half their rate, a tiny op at twice its host time) is
    left out; a point one phase alone reached (its share timed one size more) is kept; the peak, the
    compute curve and the launch cost are read again from the medians."""
    softmax = ((1024.0, 2e-6), (65536.0, 3e-5))
    phases = [_phase(1.4e11, 2.0e-6, softmax), _phase(0.7e11, 4.0e-6, ((1024.0, 4e-6), (65536.0, 6e-5))),
              _phase(1.5e11, 1.8e-6, (*softmax, (4194304.0, 2e-3)), emulated=("bfloat16",))]
    spec = median_spec(phases)
    assert spec.products["float32"].rates[1] == (1.4e11 / 2, 1.4e11)
    assert spec.peak_flops == {"float32": 1.4e11}
    assert spec.compute_curve == spec.dtype_curves["float32"] and spec.compute_curve[-1] == (2.0 * 8 * 4096, 1.0)
    assert spec.host_s == {"op": 2.0e-6, "module": 1e-6} and spec.launch_s == 2.0e-6
    assert spec.kernel_curves["softmax"] == ((1024.0, 2e-6), (65536.0, 3e-5), (4194304.0, 2e-3))
    assert spec.emulated == ()  # two phases of three found bfloat16 at speed
    assert median_spec(phases[:1]) is phases[0]


def test_a_grid_cell_is_the_median_of_the_phases_that_timed_it():
    """Two phases of three whose share stopped short of the grid's large products (filled in with the
    rate of the largest they timed, 8 and 9 GFLOP/s) do not make a large cell's rate theirs: it is the
    rate of the phase that timed it (40 GFLOP/s, not the old median's 9); a cell no phase timed is
    filled in from the medians, and the spec file says which rates were timed. Run U (2026-12-07):
    a three-phase spec whose every product past 128 rows by 512 x 512 had one rate priced two
    rounds' BERT-sized models 20% to 63% over their time."""
    short = {(1, 1024): 1e9, (1, 4096): 2e9, (8, 1024): 8e9}
    whole = {(1, 1024): 1.2e9, (1, 4096): 2.4e9, (1, 16384): 3e9, (8, 1024): 1e10, (8, 4096): 4e10, (8, 16384): 6e10}
    grids = [measured_grid((1, 8), (1024, 4096, 16384), timed) for timed in (short, {**short, (8, 1024): 9e9}, whole)]
    assert grids[0].rates == ((1e9, 2e9, 2e9), (8e9, 8e9, 8e9)) and grids[0].timed == ((True, True, False), (True, False, False))
    phases = [_phase(grid.rates[1][-1], 2e-6, ((1024.0, 2e-6),), grid=grid) for grid in grids]
    merged = median_spec(phases).products["float32"]
    assert merged.rates == ((1e9, 2e9, 3e9), (9e9, 4e10, 6e10)) and merged.timed == ((True,) * 3, (True,) * 3)
    assert median_spec(phases).peak_flops == {"float32": 6e10}
    both_short = median_spec(phases[:2])
    assert both_short.products["float32"].rates == ((1e9, 2e9, 2e9), (8.5e9, 8.5e9, 8.5e9))
    assert both_short.products["float32"].timed == ((True, True, False), (True, False, False))
    assert DeviceSpec.from_mapping(json.loads(both_short.to_json())) == both_short
    assert json.loads(both_short.to_json())["products"]["float32"]["timed"] == [[True, True, False], [True, False, False]]


def test_a_slow_stretch_over_one_phase_leaves_the_calibrated_host_time(monkeypatch):
    """The host's time per call and the bandwidth are timed in each phase, and the first phase's, five
    times the others' and a tenth of them (a stretch of a shared machine: 1.7 to 3.6 us a tiny op
    in seven calibrations on a 2-core EPYC VM), are not the spec's: the bandwidth is read afresh, not
    the process's first reading (which profiles keep); the curves net of the host's time are the
    other phases' too."""
    calls: list[float] = []

    def host_seconds(device):
        calls.append(1.0e-5 if not calls else 2.0e-6)
        return {"op": calls[-1], "view": 1e-6, "scalar": 3e-7, "module": 1e-6, "bytecode": 4e-8}

    def bandwidths():
        readings = iter((4e9, 4e10, 4.2e10))
        return functools.lru_cache(maxsize=None)(lambda device, megabytes: next(readings))
    monkeypatch.setattr(calibration, "host_seconds", host_seconds)
    monkeypatch.setattr(calibration, "per_fresh_page", lambda device: {})
    monkeypatch.setattr(calibration, "memory_bandwidth", bandwidths())
    spec = calibration.calibrate("cpu", budget_s=1.5, phases=3)
    assert len(calls) == 3
    assert spec.host_s["op"] == spec.launch_s == 2.0e-6 and spec.memory_bandwidth == 4e10
    assert spec.source.endswith("in a 2 s budget, the median of 3 phases")
    calls.clear()
    monkeypatch.setattr(calibration, "memory_bandwidth", bandwidths())
    one = calibration.calibrate("cpu", budget_s=0.5)  # one phase by default: its one reading of each
    assert calibration.PHASES == 1 and one.host_s["op"] == 1.0e-5 and one.memory_bandwidth == 4e9 and len(calls) == 1 and one.source.endswith("in a 0 s budget")


def test_the_command_line_takes_a_number_of_phases(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["calibrate", "--phases", "0"])
    assert exited.value.code == 2 and "--phases needs at least 1 phase, got 0" in capsys.readouterr().err
