"""The Python API of the tuning service: what the ``tuner`` command does, as values.

    import tuner

    tasks = tuner.extract_tasks("model.onnx", "opencl -model=pocl-cpu")
    tuner.tune(tasks[:1], "opencl -model=pocl-cpu", n_trial=16,
               callbacks=[tuner.callbacks.log_to_file("tuned.log")])
    with tuner.apply_history_best(tuner.records.log("tuned.log")):
        module = tuner.build("model.onnx", "opencl -model=pocl-cpu")

``tuner.Client`` (a server) and ``tuner.Database`` (a database, directly) share their
record methods: import_log, import_lines, export, best, pretuned_log, search.
"""

from compiler.tasks import Task
from schemas import MeasureOptions, Record, Target, Workload
from schemas.api import FINAL, JobStatus, JobView, TaskView, TrialPoint
from tuner import callbacks, records
from tuner.building import apply_history_best, build, extract_tasks, load, quantized
from tuner.callbacks import Callback, Trial
from tuner.client import Client, InvalidRequest, TunerError, Unauthorized, Unreachable
from tuner.database import Database, NoDatabase
from tuner.embedded import EmbeddedFleet, NoLocalDevice, WorkerStopped
from tuner.tuning import DEFAULT_MEASURE, TuneInterrupted, TuneResult, tune

__all__ = [
    "DEFAULT_MEASURE",
    "FINAL",
    "Callback",
    "Client",
    "Database",
    "EmbeddedFleet",
    "InvalidRequest",
    "JobStatus",
    "JobView",
    "MeasureOptions",
    "NoDatabase",
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
    "Unauthorized",
    "Unreachable",
    "WorkerStopped",
    "Workload",
    "apply_history_best",
    "build",
    "callbacks",
    "extract_tasks",
    "load",
    "quantized",
    "records",
    "tune",
]
