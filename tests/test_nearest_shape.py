""""The nearest shape" has one home (``tuner/shapes.py``: ``nearest``, ``nearest_logs``,
``nearest_first``, ``ShapeTable``) and the serving ladder one implementation (``repo.climb``
down ``repo.LADDER``), which the database path (``repo.serve_best``) and the serving index
(``api.serving.Ladder``, its pools made on first use) both climb."""

from __future__ import annotations

import itertools
import random
from types import SimpleNamespace
from typing import Any

from api.serving import Ladder
from db import repo
from tuner.shapes import (
    ShapeTable,
    log_shape,
    nearest,
    nearest_first,
    nearest_logs,
    shape_distance,
    shape_key,
)


def test_nearest_is_the_least_distance_then_the_tie_break_then_the_first():
    items = [("a", {"M": 16, "N": 64}), ("b", {"M": 64, "N": 64}), ("c", {"M": 64, "N": 16}),
             ("d", {"M": 32, "N": 32})]
    query = {"M": 32, "N": 64}
    # a and b are one doubling away, c and d further
    assert nearest(items, query, lambda i: i[1]) == (items[0], 1.0)
    assert nearest(items, query, lambda i: i[1], then=lambda i: i[0] != "b") == (items[1], 1.0)
    assert nearest([], query, lambda i: i) is None
    assert [i[0] for i in nearest_first(items, query, lambda i: i[1])] == ["a", "b", "d", "c"]
    # a dimension missing from one shape counts as 1 there
    assert nearest([{"M": 2}], {"M": 2, "K": 4}, lambda s: s) == ({"M": 2}, 2.0)


def test_the_shape_table_finds_what_nearest_finds():
    rng = random.Random(3)
    names = ["M", "N", "K"]
    shapes = [{n: 2 ** rng.randint(0, 8) for n in names if rng.random() < 0.9}
              for _ in range(60)]
    table = ShapeTable(shapes, log_shape)
    assert ShapeTable([], log_shape).nearest(log_shape({"M": 4})) == []
    for _ in range(200):
        query = {n: rng.choice([1, 3, 16, 100, 256, 4096]) for n in names}
        close = table.nearest(log_shape(query))
        found = nearest(shapes, query, lambda s: s)
        assert found is not None
        best, distance = found
        assert close[0] is best  # the first of the nearest, in the items' order
        assert all(shape_distance(s, query) == distance for s in close)
        assert nearest_logs(close, log_shape(query), log_shape) == found


def _candidate(i: int, device: str, kind: str | None, triton: str, shape: dict[str, int]
               ) -> repo.Candidate:
    row: Any = SimpleNamespace(id=i, shape=shape, shape_key=shape_key(shape))
    return repo.Candidate(row, kind, device, shape_key(shape), triton, "eager-flushed",
                          log_shape(shape), float(i % 5))


def test_the_index_s_pools_answer_as_the_ladder_over_all_and_stay_few():
    rng = random.Random(11)
    devices = [("gpu-a", "cuda"), ("gpu-b", "cuda"), ("cpu", "interpret"), ("gone", None)]
    candidates = [_candidate(i, *rng.choice(devices), rng.choice(["3.6.0", "3.6.2", "3.5.1"]),
                             {"M": 2 ** rng.randint(0, 6), "N": 64})
                  for i in range(80)]
    # rows without a Triton version (they match every minor), on one device
    candidates += [_candidate(80 + i, "gpu-b", "cuda", "", {"M": 2 ** i, "N": 64})
                   for i in range(3)]
    ladder = Ladder.of(candidates)
    callers = ["gpu-a", "gpu-b", "cpu", "gone", None, ""] + [f"made-up-{i}" for i in range(20)]
    tritons = ["3.6.0", "3.6.9", "3.5.0", None, ""] + [f"9.{i}.0" for i in range(20)]
    seen = set()
    for device, triton, m in itertools.product(callers, tritons, (1, 3, 8, 64, 1000)):
        shape = {"M": m, "N": 64}
        expected = repo.serve_best(candidates, shape=shape, device_key=device,
                                   triton_version=triton)
        got = ladder.serve(shape, device, triton)
        assert (got and (got.match, got.row.id, got.distance)) == (
            expected and (expected.match, expected.row.id, expected.distance)), (
            device, triton, m)
        seen.add(expected.match if expected else None)
    assert seen == {"exact", "nearest", "other-triton", "other-device"}
    # callers naming devices and versions at will share the pools of "none of these"
    devices_known = len({c.device_key for c in candidates}) + 1
    minors_known = len({c.triton_version[:3] or None for c in candidates}) + 1
    assert len(ladder.pools) <= len(repo.LADDER) * devices_known * minors_known
