"""The store of prompt log-probabilities already computed: what a new prompt may reuse, and its bound."""

from __future__ import annotations

from regional.engine import Logprobs
from regional.prompt_scores import PromptScores


def scores(prompt: list[int], top_n: int) -> list[Logprobs]:
    """Entry i scores token i + 1; its alternatives are ``top_n`` made-up ids."""
    return [
        Logprobs(t, -0.5 * i, [(1000 + k, -float(k)) for k in range(top_n)]) for i, t in enumerate(prompt[1:])
    ]


def test_a_prompt_takes_the_scores_of_the_tokens_it_shares_and_no_more():
    store = PromptScores()
    prompt = [1, 2, 3, 4, 5, 6]
    store.store(prompt, 3, scores(prompt, 3))
    assert store.lookup(prompt, 3) == scores(prompt, 3)  # all five
    assert store.lookup([1, 2, 3, 9, 9], 3) == scores(prompt, 3)[:2]  # tokens 2 and 3 only
    assert store.lookup([1, 9], 3) == []  # only the first token shared: nothing predicted from it
    assert store.lookup([7, 2, 3], 3) == []


def test_fewer_alternatives_are_cut_from_a_wider_entry_never_the_other_way():
    store = PromptScores()
    prompt = [1, 2, 3, 4]
    store.store(prompt, 3, scores(prompt, 3))
    narrow = store.lookup(prompt, 1)
    assert [s.top for s in narrow] == [[(1000, 0.0)]] * 3
    assert [s.logprob for s in narrow] == [s.logprob for s in scores(prompt, 3)]
    assert store.lookup(prompt, 5) == []


def test_partial_scores_are_not_stored_and_the_bound_evicts_the_least_recently_used():
    store = PromptScores(max_positions=10)
    store.store([1, 2, 3], 0, scores([1, 2, 3], 0)[:1])  # not every token scored
    assert len(store) == 0
    a, b, c = [1, 2, 3, 4, 5], [6, 7, 8, 9, 10], [11, 12, 13, 14, 15]
    store.store(a, 0, scores(a, 0))
    store.store(b, 0, scores(b, 0))
    assert store.lookup(a, 0)  # a is now the most recently used
    store.store(c, 0, scores(c, 0))  # 12 positions > 10: b goes
    assert store.lookup(b, 0) == [] and store.lookup(a, 0) and store.lookup(c, 0)


def test_a_longer_prompt_replaces_an_entry_it_covers():
    store = PromptScores()
    short, long = [1, 2, 3], [1, 2, 3, 4, 5]
    store.store(short, 2, scores(short, 2))
    store.store(long, 2, scores(long, 2))
    assert len(store) == 1 and store.lookup(long, 2) == scores(long, 2)
