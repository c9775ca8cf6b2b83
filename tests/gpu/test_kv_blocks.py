"""Paged KV bookkeeping on its own: prefix sharing, the collision check, LRU reuse, sliding windows,
paired verbs that change nothing when they say no, and a random walk of every verb with the invariants
(and a simulated KV store: every slot a sequence reads holds what its own tokens would have written)
checked after each step."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from gpu.kv_blocks import NULL_BLOCK, BlockName, BlockPool, BlockTable, GroupSpec, KvBlockManager


def manager(num_blocks: int = 32, block_size: int = 4, window: int | None = None, **kw) -> KvBlockManager:
    groups = [GroupSpec("global", num_blocks)]
    if window is not None:
        groups.append(GroupSpec("sliding", num_blocks, window=window))
    return KvBlockManager(groups, block_size=block_size, **kw)


def admit(m: KvBlockManager, tokens: list[int], *live: BlockTable) -> BlockTable:
    """Allocate and compute ``tokens`` in one step, as a prompt's prefill would (``live``: the other
    tables not yet freed, for the invariants)."""
    table = m.allocate(tokens)
    m.append(table, tokens[table.num_tokens :])
    m.check_invariants([*live, table])
    return table


def fingerprint(m: KvBlockManager, *tables: BlockTable) -> object:
    pools = {
        name: (list(p.ref_counts), list(p.generation), list(p.names), dict(p.cached), list(p.free))
        for name, p in m.pools.items()
    }
    seqs = [(list(s.tokens), list(s.block_hashes), {g: list(t) for g, t in s.tables.items()})
            for s in tables]  # fmt: skip
    return pools, seqs, dict(m.promised), m.prefix_query_tokens, m.prefix_hit_tokens


def test_sequences_with_a_common_prefix_share_its_blocks():
    m = manager()
    system = list(range(100, 112))  # three full blocks
    one = admit(m, [*system, 1, 2])
    two = m.allocate([*system, 3, 4, 5])
    assert two.num_tokens == 12  # the hit, before anything is computed
    m.append(two, [3, 4, 5])
    a, b = one.table("global"), two.table("global")
    assert a[:3] == b[:3] and a[3] != b[3]
    pool = m.pools["global"]
    assert [pool.ref_counts[x] for x in a[:3]] == [2, 2, 2] and pool.ref_counts[a[3]] == 1
    usage = m.usage()
    assert usage.prefix_hit_tokens == 12 and usage.prefix_query_tokens == 14 + 15
    assert usage.blocks_used["global"] == 5  # 3 shared + one tail each
    m.free(one)
    assert [pool.ref_counts[x] for x in b[:3]] == [1, 1, 1]
    m.check_invariants([two])


def test_generated_tokens_fill_blocks_that_a_later_prompt_reuses():
    m = manager()
    one = admit(m, [1, 2, 3, 4, 5, 6])
    m.append(one, [7])  # a sampled token fed back
    m.append(one, [8])  # fills block 1: named now
    m.check_invariants([one])
    m.free(one)
    assert m.allocate([1, 2, 3, 4, 5, 6, 7, 8, 9]).num_tokens == 8


def test_the_hit_leaves_one_token_to_compute():
    m = manager()
    one = admit(m, [1, 2, 3, 4, 5, 6, 7, 8, 9])
    two = m.allocate([1, 2, 3, 4, 5, 6, 7, 8])
    three = m.allocate([1, 2, 3, 4, 5, 6, 7, 8], max_cached=3)
    assert two.num_tokens == 4  # not 8: the last token's logits are needed
    assert three.num_tokens == 0  # and at most max_cached
    m.check_invariants([one, two, three])


def test_a_hash_collision_never_shares_a_wrong_block():
    m = manager(hash_fn=lambda parent, tokens: 42)  # every block has the same name
    one = admit(m, [1, 2, 3, 4, 5, 6, 7, 8, 9])
    two = m.allocate([9, 9, 9, 9, 5, 6, 7, 8, 9])
    three = m.allocate([1, 2, 3, 4, 1, 2, 3, 4, 9])
    assert two.num_tokens == 0  # same name, other tokens
    assert three.num_tokens == 4  # block 1 holds 1 2 3 4, but after nothing
    assert two.table("global") == [] and three.table("global") == one.table("global")[:1]
    m.check_invariants([one, two, three])


def test_a_tail_is_never_spliced_onto_another_parent_with_the_same_name():
    pool = BlockPool(3)
    parent, child = pool.take(), pool.take()
    pool.name(parent, BlockName(11, None, None, (1,)))
    pool.name(child, BlockName(22, 11, pool.ref(parent), (2,)))
    assert pool.lookup(22, 11, (2,), pool.ref(parent)) == child
    pool.release(parent)
    pool.release(child)
    assert pool.take() == parent  # the least recently freed goes first, and loses its name
    pool.name(parent, BlockName(11, None, None, (1,)))  # the same name, refilled by another prefix
    assert pool.lookup(22, 11, (2,), pool.ref(parent)) is None  # the child was filled after the old one


def test_freed_cached_blocks_are_reused_least_recently_freed_first():
    m = manager(num_blocks=9)  # 8 usable
    a, b = [1, 2, 3, 4, 5, 6, 7, 8, 9], [11, 12, 13, 14, 15, 16, 17, 18, 19]
    one = admit(m, a)  # 3 blocks: 2 full (named), 1 partial
    two = admit(m, b, one)
    pool = m.pools["global"]
    a_blocks, b_blocks = list(one.table("global")), list(two.table("global"))
    m.free(one)
    m.free(two)
    # Unnamed blocks first (never used, then the partial tails), then a's, then b's: a tail before its prefix.
    order = list(pool.free)
    named = [x for x in order if pool.names[x] is not None]
    assert named == [a_blocks[1], a_blocks[0], b_blocks[1], b_blocks[0]]
    assert order.index(a_blocks[2]) < order.index(a_blocks[1])
    # A newcomer needing 5 fresh blocks takes the 4 unnamed ones and a's tail block.
    three = admit(m, list(range(50, 70)))
    assert three.table("global")[4] == a_blocks[1]
    m.free(three)
    four = m.allocate([*a, 0])
    five = m.allocate([*b, 0])
    assert four.num_tokens == 4  # a's first block is still cached: revived
    assert five.num_tokens == 8
    assert pool.ref_counts[b_blocks[0]] == 1 and b_blocks[0] not in pool.free
    m.check_invariants([four, five])


def test_a_sliding_window_keeps_only_the_blocks_it_can_read():
    m = manager(num_blocks=64, window=8)  # 4-token blocks: a query reads its 8 latest positions
    one = m.allocate([1])
    for token in range(1, 41):
        m.append(one, [token])
        m.check_invariants([one])
        live = [x for x in one.table("sliding") if x != NULL_BLOCK]
        assert len(live) <= 3  # ceil(8 / 4) + 1
    n = one.num_tokens  # 40: the next query at 40 reads 33..39, in blocks 8 and 9
    assert one.table("sliding")[:8] == [NULL_BLOCK] * 8
    assert all(x != NULL_BLOCK for x in one.table("global")) and n == 40
    assert m.usage().blocks_used == {"global": 10, "sliding": 2}


def test_a_sliding_prefix_hit_needs_only_the_window():
    # The sliding pool is small: while the prompt is computed, its dropped blocks are reused for its later
    # ones, so only the window's blocks stay cached; a hit still covers the whole prompt but its last token.
    groups = [GroupSpec("global", 64), GroupSpec("sliding", 5, window=8)]  # 4 usable sliding blocks
    m = KvBlockManager(groups, block_size=4)
    prompt = list(range(1, 42))  # 41 tokens
    one = m.allocate(prompt)
    for start in range(0, 41, 4):  # prefill in 4-token chunks
        m.append(one, prompt[start : start + 4])
        m.check_invariants([one])
    m.free(one)
    sliding = m.pools["sliding"]
    assert len(sliding.cached) < 10  # the early blocks lost their names
    two = m.allocate(prompt)
    assert two.num_tokens == 40  # the query at 40 reads 33..39: blocks 8 and 9
    assert two.table("sliding")[:8] == [NULL_BLOCK] * 8
    assert len(two.table("global")) == 10 and NULL_BLOCK not in two.table("global")
    m.check_invariants([two])
    m.free(two)
    # Another sequence takes every sliding block: the global pool still holds the whole prompt, but no
    # window is whole any more, so nothing is a hit.
    three = m.allocate([99])
    m.append(three, [99] * 12)  # 4 blocks: every sliding block
    m.free(three)
    four = m.allocate(prompt)
    assert four.num_tokens == 0
    m.check_invariants([four])


def test_can_allocate_and_can_append_say_no_without_changing_anything():
    m = manager(num_blocks=5, window=None)  # 4 usable blocks: 16 tokens
    one = admit(m, list(range(12)))  # 3 blocks
    before = fingerprint(m, one)
    assert not m.can_allocate(list(range(100, 108)))  # needs 2, 1 free
    assert not m.can_append(one, 5)  # 17 tokens need 5 blocks
    assert fingerprint(m, one) == before
    assert m.can_append(one, 4) and m.can_allocate([100, 101, 102])
    assert fingerprint(m, one) == before  # asking is free, saying yes too


def test_a_cached_prefix_counts_against_room_only_when_it_must_be_revived():
    m = manager(num_blocks=5)  # 4 usable
    m.free(admit(m, list(range(9))))  # 3 blocks, 2 named
    # 2 cached blocks to revive + 2 fresh for 9..15 = 4: fits.
    assert m.can_allocate(list(range(16)))
    assert not m.can_allocate(list(range(17)))


# --- a random walk over every verb -------------------------------------------------------------------

TOKENS = st.lists(st.integers(min_value=1, max_value=3), min_size=1, max_size=14)


class BlockWalk(RuleBasedStateMachine):
    """Random allocate / append / free, invariants after each; a simulated KV store checks that every
    slot a sequence can read holds what its own tokens wrote there (so no wrong or stale sharing)."""

    hash_fn = None  # the real chained hash
    window: int | None = 6

    @initialize(num_blocks=st.integers(min_value=3, max_value=24), block_size=st.sampled_from([1, 2, 4]))
    def setup(self, num_blocks: int, block_size: int) -> None:
        kw = {"hash_fn": self.hash_fn} if self.hash_fn is not None else {}
        self.m = manager(num_blocks=num_blocks, block_size=block_size, window=self.window, **kw)
        self.kv: dict[tuple[str, int], tuple[int, ...]] = {}  # (group, slot) -> the prefix it was written for
        self.live: list[BlockTable] = []  # the tables not yet freed, as the sequences would hold them

    @rule(tokens=TOKENS)
    def allocate(self, tokens: list[int]) -> None:
        before = fingerprint(self.m, *self.live)
        if not self.m.can_allocate(tokens):
            assert fingerprint(self.m, *self.live) == before
            return
        table = self.m.allocate(tokens)
        assert table.num_tokens % self.m.block_size == 0 and table.num_tokens < len(tokens)
        self.live.append(table)

    @precondition(lambda self: self.live)
    @rule(data=st.data(), new=TOKENS)
    def append(self, data: st.DataObject, new: list[int]) -> None:
        table = data.draw(st.sampled_from(self.live))
        before = fingerprint(self.m, *self.live)
        if not self.m.can_append(table, len(new)):
            assert fingerprint(self.m, *self.live) == before
            return
        start = table.num_tokens
        self.m.append(table, new)
        for group in self.m.groups:  # the model writes this step's keys
            for offset, slot in enumerate(table.slots(group, start, len(new))):
                self.kv[group, slot] = tuple(table.tokens[: start + offset + 1])

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        table = data.draw(st.sampled_from(self.live))
        self.live.remove(table)
        self.m.free(table)

    @invariant()
    def books_agree(self) -> None:
        self.m.check_invariants(self.live)

    @invariant()
    def every_readable_slot_holds_this_sequences_prefix(self) -> None:
        size = self.m.block_size
        for state in self.live:
            for group in self.m.groups:
                table = state.tables[group]
                for position in range(len(state.tokens)):
                    if table[position // size] == NULL_BLOCK:
                        continue  # dropped from the window: never read again
                    slot = state.slots(group, position, 1)[0]
                    assert self.kv.get((group, slot)) == tuple(state.tokens[: position + 1])


class WeakHashWalk(BlockWalk):
    """Names from a 2-bit hash that ignores the parent: collisions everywhere, on full-attention pools
    (whose chains are checked block by block from the start)."""

    hash_fn = staticmethod(lambda parent, tokens: hash(tokens) % 4)
    window = None


WALK_SETTINGS = settings(
    max_examples=150, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestBlockWalk = BlockWalk.TestCase
TestBlockWalk.settings = WALK_SETTINGS
TestWeakHashWalk = WeakHashWalk.TestCase
TestWeakHashWalk.settings = WALK_SETTINGS


def test_bad_pool_shapes_are_refused():
    with pytest.raises(ValueError):
        KvBlockManager([GroupSpec("global", 1)])
    with pytest.raises(ValueError):
        KvBlockManager([GroupSpec("a", 4), GroupSpec("a", 4)])
    with pytest.raises(ValueError):
        KvBlockManager([GroupSpec("a", 4, window=0)])
