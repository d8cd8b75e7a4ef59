"""What ``tuner.tune`` calls as a job runs, as AutoTVM's tuner callbacks: each measured
trial as it arrives (``on_trial``), the job at every poll (``on_update``), and once at
the start and the end. A plain function of one :class:`Trial` is an ``on_trial``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING

from schemas import Record, Workload

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

    from schemas.api import JobView


@dataclass(frozen=True)
class Trial:
    """One measured trial of a job: which task (its index in the job), its number in
    that task (from 1), the outcome, and the record as stored (an AutoTVM log line;
    None if the server had not stored it when asked)."""

    job_id: int
    task: int
    workload: Workload
    number: int
    error_no: int
    cost: float | None
    gflops: float | None
    record: Record | None


class Callback:
    """Override what you need; every hook does nothing by default."""

    def on_start(self, job: JobView) -> None:
        """The job was submitted (nothing measured yet)."""

    def on_trial(self, trial: Trial) -> None:
        """One more trial was measured."""

    def on_update(self, job: JobView) -> None:
        """The job as polled, after the trials that arrived with it."""

    def on_end(self, job: JobView | None) -> None:
        """The job ended, or tuning stopped (``job`` is its last state; None if it
        never started): release what ``on_start`` took."""


class _OnTrial(Callback):
    def __init__(self, function: Callable[[Trial], object]) -> None:
        self.function = function

    def on_trial(self, trial: Trial) -> None:
        self.function(trial)


def as_callback(item: Callback | Callable[[Trial], object]) -> Callback:
    return item if isinstance(item, Callback) else _OnTrial(item)


class ProgressBar(Callback):
    """A terminal progress bar: trials done of the job's budget, best GFLOP/s, ETA."""

    def __init__(self) -> None:
        self._progress: Progress | None = None
        self._bar: TaskID | None = None

    def on_start(self, job: JobView) -> None:
        from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

        columns = (TextColumn("[bold]job {task.fields[job]}"), BarColumn(),
                   TextColumn("{task.completed}/{task.total} trials"),
                   TextColumn("best {task.fields[best]}"), TimeRemainingColumn())
        self._progress = Progress(*columns)
        self._progress.start()
        self._bar = self._progress.add_task("tune", total=self._total(job), job=job.id,
                                            best="-")

    def on_update(self, job: JobView) -> None:
        if self._progress is None or self._bar is None:
            return
        best = job.best_gflops
        self._progress.update(self._bar, completed=job.trials_done, total=self._total(job),
                              job=job.id, best=f"{best:.2f} GFLOP/s" if best else "-")

    def on_end(self, job: JobView | None) -> None:
        if self._progress is not None:
            if job is not None:
                self.on_update(job)
            self._progress.stop()
            self._progress = None

    @staticmethod
    def _total(job: JobView) -> int:
        return sum(t.n_trial for t in job.tasks)


class LogToFile(Callback):
    """Appends each measured trial's record to ``path`` as an AutoTVM log line, as it
    arrives (AutoTVM's ``log_to_file``): ``tuner.records.log(path)`` applies it."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._file: IO[str] | None = None

    def on_start(self, job: JobView) -> None:
        self._file = self.path.open("a")

    def on_trial(self, trial: Trial) -> None:
        if self._file is not None and trial.record is not None:
            self._file.write(trial.record.to_line() + "\n")
            self._file.flush()

    def on_end(self, job: JobView | None) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def progress_bar() -> ProgressBar:
    return ProgressBar()


def log_to_file(path: str | Path) -> LogToFile:
    return LogToFile(path)
