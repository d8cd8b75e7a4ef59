"""Search: tuners propose configs (arrays of their indices) from a template's space.
They know configs and measure results, never HTTP or SQL; the scheduler feeds them and
stores what they say."""

from __future__ import annotations

from schemas.api import DEFAULT_TUNER
from tuner_server.search.base import Measured, Tuner, Visited
from tuner_server.search.ga import GATuner
from tuner_server.search.grid import GridTuner
from tuner_server.search.lgbm import LGBMTuner
from tuner_server.search.random import RandomTuner

TUNERS: dict[str, type[Tuner]] = {t.name: t for t in (RandomTuner, GridTuner, GATuner,
                                                      LGBMTuner)}


def make_tuner(name: str, **kwargs: object) -> Tuner:
    try:
        cls = TUNERS[name]
    except KeyError:
        raise ValueError(f"unknown tuner {name!r}; known: {', '.join(sorted(TUNERS))}") from None
    return cls(**kwargs)  # type: ignore[arg-type]


__all__ = ["DEFAULT_TUNER", "TUNERS", "Measured", "Tuner", "Visited", "make_tuner"]
