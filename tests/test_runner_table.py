"""The device-side request table: incremental page-table writes equal the plans' page tables.

A Hypothesis state machine names requests in steps (their pages grow, get
replaced, or stay the same tuple), releases some, and overfills the table so
that idle rows are evicted; after every step each named request's row must
hold exactly its page tuple, and only changed pages may have been written.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from engine.runner.table import RequestTable

CAPACITY, MAX_PAGES, NUM_PAGES = 4, 6, 40


class TableMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.table = RequestTable(CAPACITY, MAX_PAGES, NUM_PAGES, torch.device("cpu"))
        self.pages: dict[str, tuple[int, ...]] = {}
        self.last: list[str] = []

    @rule(
        names=st.lists(st.sampled_from("abcdefg"), min_size=1, max_size=CAPACITY, unique=True),
        change=st.lists(st.sampled_from(["same", "grow", "replace"]), min_size=CAPACITY),
        new_page=st.integers(0, NUM_PAGES - 1),
    )
    def step(self, names: list[str], change: list[str], new_page: int) -> None:
        tables = []
        expected_writes = 0
        for name, how in zip(names, change, strict=False):
            old = self.pages.get(name)
            if old is None or how == "replace" or (how == "grow" and len(old) == MAX_PAGES):
                new = tuple((new_page + i * 7) % NUM_PAGES for i in range(1 + new_page % 3))
            elif how == "grow":
                new = (*old, new_page)
            else:
                new = old
            tables.append(new)
        present = {name: name in self.table for name in names}
        slots, (rows, cols, vals) = self.table.assign(names, tables)
        assert len(set(slots.tolist())) == len(names)
        self.table.apply(torch.from_numpy(rows), torch.from_numpy(cols), torch.from_numpy(vals))
        for name, new in zip(names, tables, strict=True):
            old = self.pages.get(name)
            if old is None or new[: len(old)] != old or not present[name]:
                expected_writes += len(new)
            else:
                expected_writes += len(new) - len(old)
            self.pages[name] = new
        assert len(vals) == expected_writes
        self.last = names
        self.slots = dict(zip(names, slots.tolist(), strict=True))

    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        if not self.pages:
            return
        name = data.draw(st.sampled_from(sorted(self.pages)))
        self.table.release([name])
        del self.pages[name]
        self.last = [n for n in self.last if n != name]

    @invariant()
    def named_rows_hold_their_pages(self) -> None:
        for name in self.last:
            pages = self.pages[name]
            row = self.table.pages[self.slots[name], : len(pages)].tolist()
            assert row == list(pages), (name, row, pages)


TestTable = TableMachine.TestCase
TestTable.settings = settings(max_examples=60, stateful_step_count=25, deadline=None)


def test_bad_pages_change_nothing() -> None:
    table = RequestTable(2, 4, 10, torch.device("cpu"))
    table.assign(["a"], [(1, 2)])
    with pytest.raises(ValueError, match=r"request b: page ids \[10\] outside the pool of 10"):
        table.assign(["a", "b"], [(1, 2, 3), (10,)])
    with pytest.raises(ValueError, match="5 pages exceed the table's 4 per request"):
        table.assign(["c"], [(1, 2, 3, 4, 5)])
    _, (_, cols, vals) = table.assign(["a"], [(1, 2, 3)])
    assert cols.tolist() == [2] and vals.tolist() == [3], "a's row was not touched by the errors"
    with pytest.raises(RuntimeError, match="more than 2 requests"):
        table.assign(["x", "y", "z"], [(1,), (2,), (3,)])
