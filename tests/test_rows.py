"""The typed rows (raypipe.core.rows) against the table schemas (raypipe.core.schema), and the loop's rows
against the typed rows: a column added, dropped, moved or retyped on either side fails here."""

import asyncio
import types
import typing

import pyarrow as pa
import pytest

from raypipe.agents import AgentLoop, SearchR1
from raypipe.core.config import AgentConfig
from raypipe.core.rows import IterationRow, OnlineRow, TrajectoryRow
from raypipe.core.schema import ITERATIONS, TRAJECTORIES
from raypipe.data.loaders import Question
from raypipe.testing.fakes import FakeEngine, FakeRetriever, ScriptedController

SCALARS = {pa.string(): str, pa.int32(): int, pa.float32(): float, pa.float64(): float, pa.bool_(): bool}


def python_type(arrow: pa.DataType) -> object:
    if pa.types.is_list(arrow):
        return list[python_type(arrow.value_type)]  # type: ignore[misc]
    return SCALARS[arrow]


def admits_none(hint: object) -> bool:
    return isinstance(hint, types.UnionType) and type(None) in typing.get_args(hint)


def without_none(hint: object) -> object:
    if not admits_none(hint):
        return hint
    (rest,) = [a for a in typing.get_args(hint) if a is not type(None)]
    return rest


@pytest.mark.parametrize(("row", "schema"), [(IterationRow, ITERATIONS), (TrajectoryRow, TRAJECTORIES)])
def test_a_typed_row_has_its_tables_columns_in_order_with_their_types(row, schema):
    hints = typing.get_type_hints(row)
    assert list(hints) == schema.names
    for field in schema:
        hint = hints[field.name]
        assert without_none(hint) == python_type(field.type), field.name
        if admits_none(hint):  # a hint may say "never null" of a nullable column, not the reverse
            assert field.nullable, f"{field.name}: null in the row, not nullable in the schema"


def test_an_online_row_is_an_iteration_rows_online_columns_and_the_read_documents():
    iteration, online = typing.get_type_hints(IterationRow), typing.get_type_hints(OnlineRow)
    *columns, titles, texts = online
    assert (titles, texts) == ("doc_titles", "doc_texts")
    assert columns == [name for name in iteration if name in columns]  # in the table's order
    assert {name: online[name] for name in columns} == {name: iteration[name] for name in columns}
    assert online["doc_titles"] == online["doc_texts"] == list[str]
    assert "probe_f1" not in online and "utility" not in online  # gold-based: never shown online


def test_the_loops_rows_are_its_typed_rows():
    def script(request):
        if request.prompt.endswith("<answer>"):
            return " a </answer>"
        if request.prompt.count("<information>Doc") < 2:
            return "<think> t </think>\n<search> q </search>"
        return "<think> t </think>\n<answer> a </answer>"

    controller = ScriptedController(at=9)
    loop = AgentLoop(
        FakeEngine(script),
        FakeRetriever(n=3),
        SearchR1("pyterrier"),
        AgentConfig(max_turns=4),
        top_k=2,
        deep_k=3,
        controller=controller,
    )
    question = Question(qid="q1", dataset="toy", question="Who?", golden_answers=["a"])
    output = asyncio.run(loop.run(question))
    assert output.trajectory["stop_reason"] == "answer" and len(output.iterations) == 3
    assert list(output.trajectory) == list(typing.get_type_hints(TrajectoryRow))
    for row in output.iterations:
        assert list(row) == list(typing.get_type_hints(IterationRow))
    for history in controller.histories:
        assert all(list(item) == list(typing.get_type_hints(OnlineRow)) for item in history)
