"""``tuner worker``: serve a tuning server's trials on a local device."""

from __future__ import annotations

import logging

import typer

from cli.common import check_server_url, fail
from tuner_client import ApiError, Unauthorized, Unavailable
from workers.agent import WorkerAgent

MAX_NAME = 128  # workers.name


def default_device() -> str | None:
    """The spec a worker with no --device serves: a GPU before a CPU (open_device alone
    would take the first OpenCL device, PoCL's CPU on an NVIDIA machine); None where no
    device lists, so opening it reports why."""
    from compiler.runtime import list_devices
    from compiler.runtime.device import preferred_device

    try:
        chosen = preferred_device(list_devices())
    except Exception:  # noqa: BLE001 - a broken driver: let opening the device say so
        return None
    return chosen.spec if chosen is not None else None


def worker(
    server: str = typer.Option(..., "--server", envvar="TUNER_SERVER", help="server URL"),
    token: str = typer.Option(..., "--token", envvar="TUNER_TOKEN", help="a worker token"),
    device: str | None = typer.Option(None, "--device", help="e.g. opencl:0 or cuda:0"),
    name: str | None = typer.Option(None, "--name"),
    batch: int | None = typer.Option(
        None, "--batch", min=1, max=1024,
        help="trials leased at a time (default: 4 per builder process, one per core, up "
             "to 16, so the batch's kernels build in parallel ahead of their timing; 1 "
             "with TUNER_PREBUILD=0)"),
    max_trials: int | None = typer.Option(None, "--max-trials", min=1,
                                          help="exit after this many"),
) -> None:
    """Register, lease, measure (checked against numpy), report, until SIGTERM."""
    server = check_server_url(server)
    if name is not None and not (0 < len(name) <= MAX_NAME and name.isprintable()):
        fail(f"--name: a worker name has 1 to {MAX_NAME} printable characters")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if device is None:
        device = default_device()
    if batch is None:
        from compiler.runtime.prebuild import lease_batch

        batch = lease_batch()
    agent = WorkerAgent(server, token, device, name, batch)
    agent.stop_on_signals()
    try:
        measured = agent.run(max_trials=max_trials)
    except ApiError as err:
        if isinstance(err, Unavailable):
            fail(f"{err}; the worker stopped (its leased trials return when their leases "
                 f"expire)", code=1)
        hint = ("pass a worker token with --token or TUNER_TOKEN (tuner token create --role "
                "worker)" if isinstance(err, Unauthorized) else "see the server's log")
        fail(f"the server refused this worker: {err}; {hint}", code=1)
    except RuntimeError as err:
        fail(f"{err}; the worker stopped (its leased trials return when their leases "
             f"expire)", code=1)
    typer.echo(f"measured {measured} trials")
