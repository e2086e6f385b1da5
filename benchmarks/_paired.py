"""Paired, alternating rounds and their verdict: the one method every benchmark with a floor
uses.

Each round measures the floor and the target back to back, and the order flips every round,
so a drift of the (shared, noisy) machine's load hits both alike. The verdict is the median of
the per-round ratios target/floor: a best time or a best rate is decided by one lucky round of
either side, and a median over rounds of different load mixes slow and fast rounds. The ratio
of the median values is printed beside it.

A measurement that did not complete (a timed-out wait, a wrong count) is not a figure: it
raises ``MeasurementFailed`` and the script exits non-zero instead of printing a ratio.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field


class MeasurementFailed(RuntimeError):
    """A round could not be measured; the run has no verdict."""


def require(ok: object, what: str) -> None:
    """Raise ``MeasurementFailed(what)`` unless ``ok`` (e.g. a wait that did not time out)."""
    if not ok:
        raise MeasurementFailed(what)


@dataclass
class Paired:
    """Per-round values of the floor and the target (seconds, or a rate), in round order."""

    floor: list[float] = field(default_factory=list)
    target: list[float] = field(default_factory=list)

    @property
    def ratios(self) -> list[float]:
        return [t / f for t, f in zip(self.target, self.floor, strict=True)]

    @property
    def median_ratio(self) -> float:
        """The verdict's figure: the median of the per-round ratios target/floor."""
        return statistics.median(self.ratios)

    @property
    def ratio_of_medians(self) -> float:
        return statistics.median(self.target) / statistics.median(self.floor)


def alternate(
    rounds: int,
    floor: Callable[[], float],
    target: Callable[[], float],
    *,
    target_first: bool = False,
    on_round: Callable[[int, float, float], None] | None = None,
) -> Paired:
    """Run ``rounds`` rounds of ``floor()`` and ``target()`` back to back (each returns its
    measured value), the order flipped every round; round 1 runs the floor first unless
    ``target_first``. ``on_round(round_number, floor_value, target_value)`` after each."""
    if rounds < 1:
        raise ValueError("rounds must be >= 1")
    paired = Paired()
    for i in range(rounds):
        target_now = (i % 2 == 0) == target_first
        if target_now:
            t = target()
            f = floor()
        else:
            f = floor()
            t = target()
        paired.floor.append(f)
        paired.target.append(t)
        if on_round is not None:
            on_round(i + 1, f, t)
    return paired


def verdict(ratio: float, limit: float, *, at_least: bool = False) -> str:
    """``"met"`` when ``ratio <= limit`` (times: lower is better) or, with ``at_least``,
    ``ratio >= limit`` (rates: higher is better); ``"MISSED"`` otherwise."""
    ok = ratio >= limit if at_least else ratio <= limit
    return "met" if ok else "MISSED"


def summary(label: str, paired: Paired, limit: float, *, at_least: bool = False) -> str:
    """One line: the median of the paired ratios against the target, the rounds' ratios and
    the ratio of the medians."""
    sign = ">=" if at_least else "<="
    ratios = ", ".join(f"{r:.2f}" for r in paired.ratios)
    return (
        f"{label}: median of the {len(paired.ratios)} paired round ratios "
        f"{paired.median_ratio:.2f} (target {sign} {limit:g}: "
        f"{verdict(paired.median_ratio, limit, at_least=at_least)}); rounds {ratios}; "
        f"ratio of the medians {paired.ratio_of_medians:.2f}"
    )
