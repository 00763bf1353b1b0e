"""Prefix affinity, the decision alone (specrt/scale/affinity.py; no Ray): a prompt goes to the replica that
holds its longest known prefix, unless that replica is busier than the least busy by more than the slack;
unknown prompts go to the least busy; forgotten replicas and old names are not chosen."""

from __future__ import annotations

import pytest

from specrt.scale.affinity import PrefixTable, block_names


def test_block_names_name_whole_prefixes():
    a = block_names(list(range(40)), 16)
    b = block_names(list(range(32)) + [99] * 8, 16)
    c = block_names([7] + list(range(1, 40)), 16)
    assert len(a) == 2 and a == b  # only whole blocks; the same first 32 tokens, the same names
    assert not set(a) & set(c)  # a different first token changes every name after it
    assert block_names(list(range(15)), 16) == []


def test_a_prompt_follows_its_prefix_unless_that_replica_is_too_busy():
    table = PrefixTable(block=4, slack=2)
    system = list(range(100, 120))  # a shared system prompt of 5 blocks
    first = table.choose(system + [1, 2], {"a": 0, "b": 0})
    assert first.why == "new" and first.replica == "a"  # ties go to the first candidate
    table.record_prompt(system + [1, 2], "a")
    pick = table.choose(system + [3, 4, 5], {"b": 0, "a": 1})
    assert (pick.replica, pick.why, pick.matched_tokens) == ("a", "prefix", 20)
    assert table.choose(system + [3], {"b": 0, "a": 2}).replica == "a"  # within the slack
    busy = table.choose(system + [3], {"b": 0, "a": 3})
    assert (busy.replica, busy.why) == ("b", "balance")
    other = table.choose(list(range(500, 530)), {"a": 1, "b": 0})
    assert (other.replica, other.why) == ("b", "new")


def test_the_longest_prefix_wins_and_a_replica_gone_is_not_chosen():
    table = PrefixTable(block=4, slack=8)
    base = list(range(16))
    table.record_prompt(base[:8], "a")
    table.record_prompt(base, "b")  # b holds the longer prefix (and now the first 8 tokens too)
    assert table.choose(base + [1], {"a": 0, "b": 0}).replica == "b"
    assert table.choose(base + [1], {"a": 0, "c": 0}).why == "new"  # b is not a candidate
    table.forget("b")
    assert table.choose(base + [1], {"a": 0, "b": 0}).why == "new"  # b's names died with it


def test_old_names_are_forgotten_first():
    table = PrefixTable(block=2, capacity=4)
    table.record_prompt([1, 2, 3, 4], "a")  # 2 names
    table.record_prompt([5, 6, 7, 8, 9, 10], "b")  # 3 more: the oldest of a's goes
    assert len(table) == 4
    assert table.choose([1, 2], {"a": 0, "b": 0}).why == "new"  # its first block's name was forgotten
    assert table.choose([1, 2, 3, 4], {"a": 0, "b": 0}).replica == "a"  # the longer one is still known
    assert table.choose([5, 6, 7, 8], {"a": 0, "b": 0}).replica == "b"


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="slots >= 1"):
        PrefixTable(block=0)
    with pytest.raises(ValueError, match="no candidate"):
        PrefixTable().choose([1, 2], {})


def test_new_prefixes_spread_over_the_replicas_caches():
    table = PrefixTable(block=4)
    for i in range(8):  # one after another: every replica idle each time
        ids = [1000 * i + t for t in range(12)]
        table.record_prompt(ids, table.choose(ids, {"a": 0, "b": 0}).replica)
    owners = [table.choose([1000 * i + t for t in range(12)], {"a": 0, "b": 0}).replica for i in range(8)]
    assert sorted(owners) == ["a"] * 4 + ["b"] * 4  # ties went to the replica holding fewer contexts


def test_a_replica_full_of_one_prefix_counts_as_its_slots_not_its_prompts():
    table = PrefixTable(block=4, slots=4)
    system = list(range(100, 116))
    for i in range(12):  # twelve questions on one shared system prompt, all on a
        table.record_prompt(system + [i] * 4, "a")
    for i in range(4):  # then four new conversations: b's slots are empty, a's hold four contexts
        ids = [1000 * i + t for t in range(12)]
        pick = table.choose(ids, {"a": 0, "b": 0})
        table.record_prompt(ids, pick.replica)
        assert pick.replica == "b"
    conversation = [1000 * 0 + t for t in range(12)]
    table.record_prompt(conversation + [7] * 8, "b")  # its next turn extends it: still one context
    for i in range(4):  # both full: new conversations go where the stalest context is, a's questions
        ids = [7000 + 100 * i + t for t in range(12)]
        pick = table.choose(ids, {"b": 0, "a": 0})
        table.record_prompt(ids, pick.replica)
        assert pick.replica == "a"
    ids = list(range(9000, 9012))  # now b's conversations 1-3 are the stalest
    assert table.choose(ids, {"a": 0, "b": 0}).replica == "b"
