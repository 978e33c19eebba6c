"""The floors and the circles of tests/import_graph.py, checked on the repository, and the checks
themselves on small graphs (so a check that finds nothing is not mistaken for a clean tree)."""

from __future__ import annotations

from functools import cache

import pytest

from tests.import_graph import FLOORS, circles, floor_of, upward_imports
from tests.import_graph import graph as read_graph

graph = cache(read_graph)  # the repository's graph, built once for the three checks that read it


def test_no_import_runs_up_a_floor_of_the_runtime() -> None:
    assert upward_imports(graph()) == []


def test_no_import_circle_in_the_repository() -> None:
    assert circles(graph()) == []


def test_every_runtime_subpackage_is_on_a_floor() -> None:
    runtime = {m.split(".")[1] for m in graph() if m.startswith("gpufleet.")}
    on_floors = {name for floor in FLOORS for name in floor}
    assert runtime - on_floors == set()


@pytest.mark.parametrize(
    ("edges", "expected"),
    [
        ({"a": {"b"}, "b": {"a"}}, [["a", "b"]]),
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
        ({"a": {"b"}, "b": set()}, []),
        ({"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"c"}}, [["a", "b"], ["c", "d"]]),
    ],
)
def test_circles_are_found(edges: dict[str, set[str]], expected: list[list[str]]) -> None:
    assert circles(edges) == expected


def test_an_import_up_a_floor_is_found() -> None:
    edges = {"gpufleet.domain.models": {"gpufleet.scaling.core"}, "gpufleet.scaling.core": {"gpufleet.domain.models"}}
    assert upward_imports(edges) == ["gpufleet.domain.models (floor 0) imports gpufleet.scaling.core (floor 6)"]
    assert floor_of("gpufleet_tools.cli") is None
