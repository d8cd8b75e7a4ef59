"""Does a tuning's pick beat the template's default where the build runs it? (issue 17)

For a tuning database (``bench/models.py --database-url``), every CPU conv task whose
build choice (the records' rule, as ``tuner.build`` takes it) is not the template's
default: both configs timed on the local OpenCL device in alternating rounds, each in
plain NCHW (how trials were timed before they took the build's layout) and in the
layout a model build runs them in (``Template.measure_io``: data NCHW16c, output in the
config's own oc_bn), each output checked against numpy first. Then the verification's
noise: per round and place in the round, a verified measurement over the fastest of its
config's rounds (medians over the tasks), which is 1.0 on a quiet device.

With ``--models``, per layer of each model whose tuned build runs another template or
config than its untuned build (``select_layers`` with and without the records): the
untuned choice against the tuned one, in the layout a trial times each (as built),
alternating, checked against numpy; the templates are separate tasks, so here the build
compares verified costs measured at different moments of the tuning.

    .venv/bin/python bench/tuned_picks.py --database-url sqlite:////tmp/r50.db
    .venv/bin/python bench/tuned_picks.py --database-url sqlite:////tmp/r50.db \
        --models resnet50
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict
from collections.abc import Callable

import numpy as np
import sqlalchemy as sa
from common import checked_launch, light_model, print_header

import tuner
from compiler.build_module import load_graph, select_layers
from compiler.passes import optimize
from compiler.records import choose_configs
from compiler.runtime import Device, open_device
from compiler.templates import IOLayout, get_template
from schemas import Config, Workload

RUNS = 5  # launches per timing


def prepared(device: Device, workload: Workload, config: Config, blocked: bool
             ) -> Callable[[], float]:
    """Seconds per launch of ``config`` (``RUNS`` back to back, wall clock), its output
    checked against numpy first."""
    template = get_template(workload.template)
    io = (template.measure_io(workload, config) if blocked else None) or IOLayout()
    launch = checked_launch(device, workload, config, io)

    def timed() -> float:
        launch()
        device.synchronize()
        began = time.perf_counter()
        for _ in range(RUNS):
            launch()
        device.synchronize()
        return (time.perf_counter() - began) / RUNS
    return timed


def workloads_of(url: str) -> list[Workload]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            keys = conn.execute(sa.text("SELECT DISTINCT workload_key FROM records")).scalars()
            found = [Workload(template=t, args=a) for t, a in map(json.loads, keys)]
    finally:
        engine.dispose()
    return [w for w in found if get_template(w.template).blocked_io]


def picks(device: Device, url: str, rounds: int) -> None:
    choices = choose_configs(workloads_of(url), tuner.records.database(url),
                             device.target, device.limits)
    print("| template | data | weight | stride | default / pick, plain | default / pick, "
          "as built | default ms, as built | pick ms, as built |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    ratios: dict[bool, list[float]] = {False: [], True: []}
    same = 0
    for choice in choices:
        workload = choice.workload
        default = get_template(workload.template).default_config(workload, device.limits)
        if choice.record is None or choice.config.index == default.index:
            same += 1
            continue
        runs = {(name, blocked): prepared(device, workload, config, blocked)
                for name, config in (("default", default), ("pick", choice.config))
                for blocked in (False, True)}
        times: dict[tuple[str, bool], list[float]] = {key: [] for key in runs}
        for r in range(rounds):
            for key in (list(runs) if r % 2 == 0 else list(runs)[::-1]):
                times[key].append(runs[key]())
        med = {key: statistics.median(v) for key, v in times.items()}
        for blocked in (False, True):
            ratios[blocked].append(med[("default", blocked)] / med[("pick", blocked)])
        args = workload.args
        print(f"| {workload.template} | {args[0][1]} | {args[1][1]} | {args[2][0]} | "
              f"{ratios[False][-1]:.3f} | {ratios[True][-1]:.3f} | "
              f"{med[('default', True)] * 1e3:.3f} | {med[('pick', True)] * 1e3:.3f} |")
    for blocked, label in ((False, "plain"), (True, "as built")):
        if ratios[blocked]:
            geo = float(np.exp(np.mean(np.log(ratios[blocked]))))
            print(f"# default / pick, geomean over {len(ratios[blocked])} tasks, {label}: "
                  f"{geo:.3f} (> 1: the picks are faster)")
    print(f"# {same} of {len(choices)} tasks build the default config")


def layer_picks(device: Device, url: str, model: str, rounds: int) -> None:
    graph = optimize(load_graph(light_model(model)))
    untuned, _, _ = select_layers(graph, device.target, None, device.limits)
    tuned, _, _ = select_layers(graph, device.target, tuner.records.database(url),
                                device.limits)
    print(f"\n## {model}: layers whose tuned choice differs from the untuned one\n")
    print("| layer | untuned: template | tuned: template, verified ms | untuned ms | tuned ms "
          "| untuned / tuned |")
    print("|---|---|---|---:|---:|---:|")
    ratios, timed = [], {}
    for node, pick in tuned.items():
        was = untuned[node]
        if pick.workload.key == was.workload.key and pick.config.index == was.config.index:
            continue
        key = (pick.workload.key, pick.config.index, was.workload.key, was.config.index)
        if key not in timed:  # a repeated block: the same pair, timed once
            runs = {name: prepared(device, c.workload, c.config, True)
                    for name, c in (("untuned", was), ("tuned", pick))}
            times: dict[str, list[float]] = {name: [] for name in runs}
            for r in range(rounds):
                for name in (list(runs) if r % 2 == 0 else list(runs)[::-1]):
                    times[name].append(runs[name]())
            timed[key] = {name: statistics.median(v) for name, v in times.items()}
        med = timed[key]
        ratios.append(med["untuned"] / med["tuned"])
        verified = f"{pick.cost * 1e3:.3f}" if pick.cost is not None else "-"
        print(f"| {node.name} {pick.workload.args[0][1][1:]} -> {pick.workload.args[1][1][0]} "
              f"| {was.workload.template} | {pick.workload.template}, {verified} | "
              f"{med['untuned'] * 1e3:.3f} | {med['tuned'] * 1e3:.3f} | {ratios[-1]:.3f} |")
    if ratios:
        geo = float(np.exp(np.mean(np.log(ratios))))
        slower = sum(r < 1 for r in ratios)
        print(f"# untuned / tuned, geomean over {len(ratios)} layers: {geo:.3f} (> 1: the "
              f"tuned choices are faster); {slower} tuned choices slower")


def verification_noise(url: str) -> None:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(sa.text(
                "SELECT t.task_id, t.verify_round, t.config_index, r.mean_cost, r.error_no "
                "FROM trials t JOIN records r ON r.trial_id = t.id "
                "WHERE t.verify_round > 0 ORDER BY t.id")).all()
    finally:
        engine.dispose()
    by_task: dict[int, list[tuple[int, int, float | None]]] = defaultdict(list)
    for task, round_, config, cost, error_no in rows:  # a failed one keeps its place
        by_task[task].append((round_, config, cost if error_no == 0 else None))
    over: dict[tuple[int, int], list[float]] = defaultdict(list)
    for measured in by_task.values():
        fastest: dict[int, float] = {}
        for _round, config, cost in measured:
            if cost is not None:
                fastest[config] = min(cost, fastest.get(config, cost))
        places: dict[int, int] = defaultdict(int)
        for round_, config, cost in measured:
            if cost is not None:
                over[(round_, places[round_])].append(cost / fastest[config])
            places[round_] += 1
    print("\n| round | place | measurements | over its fastest round: median | mean |")
    print("|---:|---:|---:|---:|---:|")
    for (round_, place), values in sorted(over.items()):
        print(f"| {round_} | {place + 1} | {len(values)} | {statistics.median(values):.3f} | "
              f"{statistics.mean(values):.3f} |")
    every = [v for values in over.values() for v in values]
    if every:
        print(f"# all {len(every)} verified measurements: median {statistics.median(every):.3f}, "
              f"mean {statistics.mean(every):.3f} of their config's fastest round; "
              f"{len(by_task)} tasks")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--database-url", required=True)
    p.add_argument("--device", default="opencl:0")
    p.add_argument("--rounds", type=int, default=7, help="alternating timing rounds")
    p.add_argument("--models", default="", help="light models, comma-separated: per layer")
    args = p.parse_args(argv)
    device = open_device(args.device)
    print_header("bench/tuned_picks.py", device.info.name)
    picks(device, args.database_url, args.rounds)
    for model in filter(None, args.models.split(",")):
        layer_picks(device, args.database_url, model, args.rounds)
    verification_noise(args.database_url)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
