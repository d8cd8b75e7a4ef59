"""The Python API of the tuning service: what the ``tuner`` command does, as values.

    import tuner

    tasks = tuner.extract_tasks("model.onnx", "opencl -model=pocl-cpu")
    tuner.tune(tasks[:1], "opencl -model=pocl-cpu", n_trial=16,
               callbacks=[tuner.callbacks.log_to_file("tuned.log")])
    with tuner.apply_history_best(tuner.records.log("tuned.log")):
        module = tuner.build("model.onnx", "opencl -model=pocl-cpu")
"""

from compiler.tasks import Task
from schemas import MeasureOptions, Record, Target, Workload
from schemas.api import FINAL, JobStatus, JobView, TaskView, TrialPoint
from tuner import callbacks, records
from tuner.building import apply_history_best, build, extract_tasks, load
from tuner.callbacks import Callback, Trial
from tuner.client import Client, TunerError, Unreachable
from tuner.embedded import EmbeddedFleet, NoLocalDevice, WorkerStopped
from tuner.tuning import TuneInterrupted, TuneResult, tune

__all__ = [
    "FINAL",
    "Callback",
    "Client",
    "EmbeddedFleet",
    "JobStatus",
    "JobView",
    "MeasureOptions",
    "NoLocalDevice",
    "Record",
    "Target",
    "Task",
    "TaskView",
    "Trial",
    "TrialPoint",
    "TuneInterrupted",
    "TuneResult",
    "TunerError",
    "Unreachable",
    "WorkerStopped",
    "Workload",
    "apply_history_best",
    "build",
    "callbacks",
    "extract_tasks",
    "load",
    "records",
    "tune",
]
