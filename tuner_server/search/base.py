"""The tuner interface: given what was measured, propose the next batch of configs."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from compiler.templates import Template
from schemas import Config, DeviceLimits, MeasureResult, Workload


class Tuner(ABC):
    """Stateless between plans: everything it needs comes in, so a restarted server
    resumes a task from the database alone."""

    name: str
    needs_history = False  # model-based tuners read the measured configs

    def __init__(self, template: Template, workload: Workload,
                 limits: DeviceLimits | None = None, seed: int = 0) -> None:
        self.template = template
        self.workload = workload
        self.space = template.space(workload)
        self.limits = limits
        self.seed = seed

    def fits(self, config: Config) -> bool:
        return self.limits is None or not self.template.check_limits(
            self.workload, config, self.limits)

    @abstractmethod
    def next_batch(self, n: int, visited: set[int],
                   history: Sequence[tuple[Config, MeasureResult]] = ()) -> list[Config]:
        """Up to ``n`` configs, none of them in ``visited``, each fitting the limits."""
