"""The benchmarks' shared verdict (``benchmarks/_paired.py``): paired rounds in alternating
order, judged on the median of the per-round ratios; a failed measurement is no figure."""

from __future__ import annotations

import pytest

from benchmarks._paired import MeasurementFailed, Paired, alternate, require, summary, verdict


def recorder(values: list[float], calls: list[str], name: str):
    it = iter(values)

    def measure() -> float:
        calls.append(name)
        return next(it)

    return measure


def test_rounds_alternate_the_order_and_pair_the_values():
    calls: list[str] = []
    seen: list[tuple[int, float, float]] = []
    paired = alternate(
        4,
        recorder([1.0, 2.0, 3.0, 4.0], calls, "floor"),
        recorder([10.0, 20.0, 30.0, 40.0], calls, "target"),
        on_round=lambda i, f, t: seen.append((i, f, t)),
    )
    assert calls == ["floor", "target", "target", "floor"] * 2
    assert (paired.floor, paired.target) == ([1.0, 2.0, 3.0, 4.0], [10.0, 20.0, 30.0, 40.0])
    assert seen == [(1, 1.0, 10.0), (2, 2.0, 20.0), (3, 3.0, 30.0), (4, 4.0, 40.0)]


def test_target_first_starts_with_the_target():
    calls: list[str] = []
    alternate(
        3,
        recorder([1, 1, 1], calls, "floor"),
        recorder([1, 1, 1], calls, "target"),
        target_first=True,
    )
    assert calls == ["target", "floor", "floor", "target", "target", "floor"]


def test_the_verdict_is_the_median_of_the_paired_ratios_not_the_best_times():
    # One lucky floor round (0.5 s) puts the best-times ratio at 2.0, missing a 1.25 target;
    # each round's pair says about 1.1.
    paired = Paired(floor=[0.5, 1.0, 1.0], target=[1.0, 1.1, 1.05])
    assert min(paired.target) / min(paired.floor) == pytest.approx(2.0)
    assert paired.ratios == pytest.approx([2.0, 1.1, 1.05])
    assert paired.median_ratio == pytest.approx(1.1)
    assert verdict(paired.median_ratio, 1.25) == "met"
    assert verdict(1.3, 1.25) == "MISSED"
    assert verdict(0.72, 0.7, at_least=True) == "met"
    assert verdict(0.69, 0.7, at_least=True) == "MISSED"
    line = summary("drain/raw", paired, 1.25)
    assert "median of the 3 paired round ratios 1.10 (target <= 1.25: met)" in line


def test_a_failed_measurement_raises_instead_of_giving_a_figure():
    require(True, "fine")
    with pytest.raises(MeasurementFailed, match="did not finish"):
        require(False, "the drain did not finish within 600 s")

    def timed_out() -> float:
        require(False, "the drain did not finish")
        return 1.0

    with pytest.raises(MeasurementFailed):
        alternate(3, lambda: 1.0, timed_out)
