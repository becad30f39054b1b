"""The suite's xdist scheduler (tests/conftest.py): work stealing that keeps TOGETHER's groups whole,
driven here with stand-in workers that run their queues at different speeds."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from tests.conftest import TOGETHER, _Together


class Worker:
    """What the scheduler sees of a worker: its queue, as xdist's worker keeps it."""

    def __init__(self, name: str) -> None:
        self.gateway = SimpleNamespace(id=name)
        self.shutting_down = False
        self.queue: list[int] = []
        self.ran: list[int] = []
        self.asked: list[int] | None = None  # a steal request not yet answered

    def send_runtest_some(self, indices: list[int]) -> None:
        self.queue += indices

    def send_steal(self, indices: list[int]) -> None:
        self.asked = list(indices)

    def shutdown(self) -> None:
        self.shutting_down = True


def run(collection: list[str], speeds: list[int]) -> list[Worker]:
    config: Any = SimpleNamespace(getvalue=lambda name: [f"{len(speeds)}*popen"] if name == "tx" else None)
    scheduler = _Together(config)
    workers = [Worker(f"gw{k}") for k in range(len(speeds))]
    for worker in workers:
        scheduler.add_node(worker)  # type: ignore[arg-type]
        scheduler.add_node_collection(worker, collection)  # type: ignore[arg-type]
    scheduler.schedule()
    for _ in range(10 * len(collection)):
        if scheduler.tests_finished and not any(w.queue for w in workers):
            return workers
        for worker, speed in zip(workers, speeds, strict=True):
            if worker.asked is not None:  # as xdist's worker: all of them if none has started, else none
                stolen = worker.asked if set(worker.asked) <= set(worker.queue[1:]) else []
                worker.queue = [i for i in worker.queue if i not in stolen]
                worker.asked = None
                scheduler.remove_pending_tests_from_node(worker, stolen)  # type: ignore[arg-type]
            for _ in range(speed):
                if worker.queue:
                    worker.ran.append(index := worker.queue.pop(0))
                    scheduler.mark_test_complete(worker, index)  # type: ignore[arg-type]
    raise AssertionError("the scheduler never finished")


def grouped(tests_a_module: int) -> list[str]:
    return [f"{path}::test_{k}" for path in TOGETHER for k in range(tests_a_module)]


def ungrouped(modules: int, tests_a_module: int) -> list[str]:
    return [f"tests/unit/test_m{m}.py::test_{k}" for m in range(modules) for k in range(tests_a_module)]


def test_a_group_runs_whole_and_in_file_order_on_one_worker_even_while_others_are_idle() -> None:
    collection = grouped(6) + ungrouped(2, 15)
    workers = run(collection, speeds=[1, 1, 5])  # the third runs out while both groups have tests left

    assert sorted(i for w in workers for i in w.ran) == list(range(len(collection)))  # each test once
    for group in set(TOGETHER.values()):
        members = [i for i, nodeid in enumerate(collection) if TOGETHER.get(nodeid.split("::")[0]) == group]
        holders = [w for w in workers if set(members) & set(w.ran)]
        assert len(holders) == 1, group
        assert [i for i in holders[0].ran if i in members] == members


def test_the_other_tests_are_shared_out_and_a_worker_that_runs_out_takes_some_of_the_busiest() -> None:
    collection = ungrouped(20, 15)
    workers = run(collection, speeds=[1, 2, 6])

    assert sorted(i for w in workers for i in w.ran) == list(range(len(collection)))
    shares = [len(w.ran) for w in workers]
    assert shares[0] < shares[1] < shares[2], shares  # an even start, then the faster took more
    assert all(share >= 30 for share in shares), shares
