"""``replace_leaves``: the one walk that swaps arguments for copies (in, out, at launch)."""

from __future__ import annotations

from collections import OrderedDict, namedtuple
from typing import Any

from schedsvc._runtime import replace_leaves

Pair = namedtuple("Pair", "a b")


def double_ints(x: Any) -> Any:
    return x * 2 if type(x) is int else x


def test_containers_with_nothing_replaced_are_returned_themselves() -> None:
    args = [("x", {"k": "y"}), ["z"]]
    assert replace_leaves(args, double_ints) is args


def test_leaves_are_replaced_at_any_depth() -> None:
    assert replace_leaves([1, (2, {"k": 3}), "s"], double_ints) == [2, (4, {"k": 6}), "s"]
    assert replace_leaves(5, double_ints) == 10


def test_subclasses_keep_their_type() -> None:
    pair = replace_leaves(Pair(1, "b"), double_ints)
    assert type(pair) is Pair and pair == Pair(2, "b")
    ordered = replace_leaves(OrderedDict(a=1, b=2), double_ints)
    assert type(ordered) is OrderedDict and list(ordered.items()) == [("a", 2), ("b", 4)]

    class Tagged(list[Any]):
        tag = ""

    tagged = Tagged([1, 2])
    tagged.tag = "t"
    out = replace_leaves(tagged, double_ints)
    assert type(out) is Tagged and out == [2, 4] and out.tag == "t" and tagged == [1, 2]
