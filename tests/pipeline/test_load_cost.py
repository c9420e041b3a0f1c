"""`load_policy: cost`: the cost model's arithmetic with a hand-driven clock, and the pipeline
declining disk promotions and remote probes or fetches that would be slower than recomputing
(no I/O is submitted for them), loading them when they pay. Each test runs in milliseconds."""

from __future__ import annotations

import time
from typing import cast

import pytest

from kvstore.keys import BlockKey, Tier
from kvstore.pipeline.load_cost import (
    EXPLORE_FRACTION,
    EXPLORE_MAX_S,
    STEP_JITTER_S,
    LoadCostModel,
)
from kvstore.pipeline.remote import RemoteSteps
from kvstore.pipeline.waits import ALONE_WAIT_MAX_S, LookupWaits
from kvstore.service.completions import Completion
from kvstore.service.inline_remote import SharedRemote

from .test_pipeline_ops import CHUNK_BYTES, TOKENS, Rig, evict_from_cpu, ks, make_rig
from .test_pipeline_remote import Engine, make_engine


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def model(clock: Clock | None = None) -> tuple[LoadCostModel, list[tuple[Tier, str]]]:
    decisions: list[tuple[Tier, str]] = []
    cost = LoadCostModel(
        chunk_bytes=CHUNK_BYTES,
        tokens_per_chunk=TOKENS,
        on_decision=lambda tier, decision: decisions.append((tier, decision)),
        clock=clock or Clock(),
    )
    return cost, decisions


def teach(
    cost: LoadCostModel, *, s_per_token: float, disk_s_per_chunk: float = 0.0,
    remote_latency_s: float = 0.0, remote_s_per_chunk: float = 0.0,
) -> None:  # fmt: skip
    for _ in range(3):
        cost.observe_step(4 * TOKENS, 4 * TOKENS * s_per_token)
        cost.observe_transfer(Tier.DISK, 2 * CHUNK_BYTES, 2 * disk_s_per_chunk)
        cost.observe_round_trip(Tier.REMOTE, remote_latency_s)
        cost.observe_transfer(
            Tier.REMOTE, 2 * CHUNK_BYTES, remote_latency_s + 2 * remote_s_per_chunk
        )


# -- the model --------------------------------------------------------------------------------


def test_nothing_measured_means_load_and_the_load_is_the_measurement() -> None:
    cost, decisions = model()
    assert cost.recompute_s(4) is None and cost.load_s(Tier.DISK, 4) is None
    assert cost.pays(Tier.DISK, 4) and cost.pays(Tier.REMOTE, 4)
    assert decisions == [(Tier.DISK, "load"), (Tier.REMOTE, "load")]


def test_expected_times_follow_the_measurements() -> None:
    cost, _ = model()
    teach(cost, s_per_token=0.001, disk_s_per_chunk=0.002, remote_latency_s=0.05,
          remote_s_per_chunk=0.004)  # fmt: skip
    assert cost.recompute_s(3) == pytest.approx(3 * TOKENS * 0.001)
    assert cost.load_s(Tier.DISK, 3) == pytest.approx(3 * 0.002)
    assert cost.load_s(Tier.REMOTE, 3) == pytest.approx(0.05 + 3 * 0.004)
    assert cost.load_s(Tier.REMOTE, 3, round_trips=2) == pytest.approx(0.1 + 3 * 0.004)


def test_a_load_pays_when_it_beats_the_recompute_by_the_margin() -> None:
    cost, decisions = model()
    recompute_per_chunk = TOKENS * 0.001
    teach(cost, s_per_token=0.001, disk_s_per_chunk=0.8 * recompute_per_chunk,
          remote_latency_s=0.0, remote_s_per_chunk=0.95 * recompute_per_chunk)  # fmt: skip
    assert cost.pays(Tier.DISK, 5)  # 0.8x the recompute: within the 0.9 margin
    assert not cost.pays(Tier.REMOTE, 5)  # 0.95x: not worth the round trip
    assert decisions == [(Tier.DISK, "load"), (Tier.REMOTE, "recompute")]


def test_a_hybrid_hit_weighs_its_entries_against_the_tokens_they_stand_for() -> None:
    """A hybrid engine's entries are one KV cache group's share of a chunk: four entries may
    stand for one chunk's tokens, so counting them as chunks would overrate the recompute."""
    cost, _ = model()
    recompute_per_chunk = TOKENS * 0.001
    teach(cost, s_per_token=0.001, disk_s_per_chunk=0.5 * recompute_per_chunk)
    assert cost.recompute_s(8, num_tokens=2 * TOKENS) == pytest.approx(2 * recompute_per_chunk)
    assert cost.decide(Tier.DISK, 8)  # 8 chunks' reads for 8 chunks' tokens: 0.5x
    assert not cost.decide(Tier.DISK, 8, num_tokens=2 * TOKENS)  # for 2 chunks': 2x


def test_a_hybrid_lookup_promotes_only_when_reading_beats_recomputing_the_hit() -> None:
    cost, decisions = model()
    rig = make_rig(cost=cost)
    rig.store_chunks(ks(1, 2, 3, 4))
    rig.settle()
    evict_from_cpu(rig, ks(1, 2, 3, 4))
    teach(cost, s_per_token=0.001, disk_s_per_chunk=0.5 * TOKENS * 0.001)
    # four entries standing for one chunk of tokens (four groups' shares of it)
    answer = rig.pipeline.prepare_lookup(
        "r1", ks(1, 2, 3, 4), token_counts=[TOKENS, 0, 0, 0], num_asked_chunks=1
    )
    assert not answer.is_pending and answer.tiers == ()
    assert decisions == [(Tier.DISK, "recompute")]
    answer = rig.pipeline.prepare_lookup("r2", ks(1, 2, 3, 4))  # as four chunks: pays
    assert answer.is_pending and decisions[-1] == (Tier.DISK, "load")


def test_latency_is_paid_once_so_a_longer_hit_pays_sooner() -> None:
    cost, _ = model()
    teach(cost, s_per_token=0.001, remote_latency_s=0.1, remote_s_per_chunk=0.001)
    assert not cost.pays(Tier.REMOTE, 2)  # 0.1 s latency vs 32 ms of compute
    assert cost.pays(Tier.REMOTE, 20)  # 0.12 s vs 0.32 s


def test_decode_steps_do_not_count_as_the_cost_of_prefill() -> None:
    cost, _ = model()
    for _ in range(5):
        cost.observe_step(2, 1.0)  # two decode tokens in a slow step
    assert cost.recompute_s(1) is None


def test_figures_go_stale_and_loads_resume_to_measure_again() -> None:
    clock = Clock()
    cost, _ = model(clock)
    teach(cost, s_per_token=0.0001, disk_s_per_chunk=1.0)
    assert not cost.pays(Tier.DISK, 4)
    clock.now += cost.stale_s + 1
    assert cost.pays(Tier.DISK, 4)  # a disk that may have recovered is tried again
    cost.observe_transfer(Tier.DISK, CHUNK_BYTES, 1.0)
    cost.observe_transfer(Tier.DISK, CHUNK_BYTES, 1.0)
    assert cost.recompute_s(1) is None  # compute figures are stale too: load
    teach(cost, s_per_token=0.0001, disk_s_per_chunk=1.0)
    assert not cost.pays(Tier.DISK, 4)


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="margin"):
        LoadCostModel(chunk_bytes=1, tokens_per_chunk=1, margin=0)
    with pytest.raises(ValueError, match="chunk_bytes"):
        LoadCostModel(chunk_bytes=0, tokens_per_chunk=1)


# -- the pipeline -------------------------------------------------------------------------------


@pytest.mark.parametrize("is_slow", [True, False], ids=["slow-disk", "fast-disk"])
def test_a_disk_hit_slower_than_recompute_is_not_promoted(is_slow: bool) -> None:
    cost, decisions = model()
    rig = make_rig(cost=cost)
    rig.store_chunks(ks(1, 2))
    rig.settle()
    evict_from_cpu(rig, ks(1, 2))
    teach(cost, s_per_token=0.001, disk_s_per_chunk=1.0 if is_slow else 0.001)
    answer = rig.pipeline.prepare_lookup("r1", ks(1, 2, 3))
    if is_slow:
        assert not answer.is_pending and answer.tiers == ()
        assert rig.service.num_pending == 0  # no read was submitted
        assert rig.index.stats().num_holds == 0
        assert decisions == [(Tier.DISK, "recompute")]
        return
    assert answer.is_pending and rig.service.num_pending == 1
    rig.settle()
    assert rig.pipeline.prepare_lookup("r1", ks(1, 2, 3)).tiers == (Tier.DISK, Tier.DISK)
    assert decisions == [(Tier.DISK, "load")]


def test_a_slow_remote_is_not_even_probed_and_a_fast_one_is_fetched() -> None:
    shared = SharedRemote(16)
    writer = make_engine(shared)
    writer.store_chunks(ks(1, 2, 3))
    writer.settle()

    slow_cost, slow_decisions = model()
    slow = make_engine(shared, cost=slow_cost)
    teach(slow_cost, s_per_token=0.001, remote_latency_s=0.05, remote_s_per_chunk=0.05)
    answer = slow.pipeline.prepare_lookup("r1", ks(1, 2, 3, 4))
    assert not answer.is_pending and answer.tiers == ()
    assert slow.service.num_pending == 0  # nothing asked of Redis
    assert slow_decisions == [(Tier.REMOTE, "recompute")]

    fast_cost, fast_decisions = model()
    fast = make_engine(shared, cost=fast_cost)
    teach(fast_cost, s_per_token=0.001, remote_latency_s=0.0005, remote_s_per_chunk=0.0001)
    assert fast.lookup("r1", ks(1, 2, 3, 4)) == (Tier.REMOTE,) * 3
    assert fast_decisions == [(Tier.REMOTE, "load")]


def test_round_trips_alone_can_rule_a_link_out_before_its_bytes_are_measured() -> None:
    cost, decisions = model()
    for _ in range(3):
        cost.observe_step(4 * TOKENS, 4 * TOKENS * 0.0001)  # 4 chunks recompute in 1.6 ms
        cost.observe_round_trip(Tier.REMOTE, 0.05)  # a probe of a distant Redis
    assert cost.load_s(Tier.REMOTE, 4) is None  # nothing fetched yet
    assert cost.floor_s(Tier.REMOTE, 4, round_trips=2) == pytest.approx(0.1)
    assert not cost.pays(Tier.REMOTE, 4, round_trips=2)
    assert cost.floor_s(Tier.DISK, 4) is None and cost.pays(Tier.DISK, 4)
    assert decisions == [(Tier.REMOTE, "recompute"), (Tier.DISK, "load")]


def test_one_sample_of_a_slow_link_is_enough_to_decline_it() -> None:
    """Too few samples for the expected time, but the fastest seen already puts the load past
    the recompute: declined, not explored again. A fast first sample is not enough to load
    (the expectation needs its samples); it only does not rule the link out."""
    cost, decisions = model()
    for _ in range(3):
        cost.observe_step(4 * TOKENS, 4 * TOKENS * 0.001)  # 4 chunks recompute in 64 ms
    cost.observe_round_trip(Tier.REMOTE, 0.01)
    cost.observe_transfer(Tier.REMOTE, 2 * CHUNK_BYTES, 0.01 + 2 * 0.05)  # 50 ms per chunk
    assert cost.load_s(Tier.REMOTE, 4) is None  # one latency sample: not settled
    assert cost.floor_s(Tier.REMOTE, 4) == pytest.approx(0.01 + 4 * 0.05)
    assert not cost.pays(Tier.REMOTE, 4)
    cost.observe_round_trip(Tier.REMOTE, 0.5)  # a slow outlier does not raise the floor
    assert cost.floor_s(Tier.REMOTE, 4) == pytest.approx(0.01 + 4 * 0.05)

    fast, _ = model()
    for _ in range(3):
        fast.observe_step(4 * TOKENS, 4 * TOKENS * 0.001)
    fast.observe_round_trip(Tier.REMOTE, 0.001)
    fast.observe_transfer(Tier.REMOTE, 2 * CHUNK_BYTES, 0.001 + 2 * 0.001)
    assert fast.pays(Tier.REMOTE, 4)
    assert decisions == [(Tier.REMOTE, "recompute")]


def test_a_wait_is_budgeted_from_the_expected_load_within_the_recompute() -> None:
    cost, _ = model()
    assert cost.wait_budget_s(Tier.REMOTE, 4) is None  # nothing measured: no limit
    for _ in range(3):
        cost.observe_step(4 * TOKENS, 4 * TOKENS * 0.01)
    recompute = 4 * TOKENS * 0.01
    # the link not measured: the least, a small fraction of the recompute
    assert cost.wait_budget_s(Tier.REMOTE, 4) == pytest.approx(EXPLORE_FRACTION * recompute)

    def budget(s_per_token: float, latency_s: float, s_per_chunk: float) -> float | None:
        fresh, _ = model()
        teach(fresh, s_per_token=s_per_token, remote_latency_s=latency_s,
              remote_s_per_chunk=s_per_chunk)  # fmt: skip
        return fresh.wait_budget_s(Tier.REMOTE, 4)

    assert budget(0.01, 0.01, 0.02) == pytest.approx(2 * (0.01 + 4 * 0.02))
    assert budget(0.01, 0.0, TOKENS * 0.01) == pytest.approx(cost.margin * recompute)
    # a small load going fine is not given up within a scheduler step's jitter
    assert budget(0.01, 0.001, 0.001) == pytest.approx(STEP_JITTER_S)
    assert budget(0.0001, 0.001, 0.001) == pytest.approx(cost.margin * 4 * TOKENS * 0.0001)


def test_an_unmeasured_disk_may_take_up_to_the_margin_an_unmeasured_link_only_a_fraction() -> None:
    cost, _ = model()
    for _ in range(3):
        cost.observe_step(4 * TOKENS, 4 * TOKENS * 0.01)
    recompute = 4 * TOKENS * 0.01
    assert cost.wait_budget_s(Tier.DISK, 4) == pytest.approx(cost.margin * recompute)
    assert cost.wait_budget_s(Tier.REMOTE, 4) == pytest.approx(EXPLORE_FRACTION * recompute)
    teach(cost, s_per_token=0.01, disk_s_per_chunk=0.01)
    assert cost.wait_budget_s(Tier.DISK, 4) == pytest.approx(2 * 4 * 0.01)


def test_an_unmeasured_link_gets_at_most_a_tenth_of_a_second_however_long_the_recompute() -> None:
    """On a slow CPU a prefill takes seconds; 5% of that let the first request on a slow link
    wait half a second. The cap is what a probe and a first sample need on a good link."""
    cost, _ = model()
    for _ in range(3):  # 4 chunks recompute in 6.4 s
        cost.observe_step(4 * TOKENS, 4 * TOKENS * 0.1)
    assert EXPLORE_FRACTION * cost.recompute_s(4) > EXPLORE_MAX_S  # type: ignore[operator]
    assert cost.wait_budget_s(Tier.REMOTE, 4) == pytest.approx(EXPLORE_MAX_S)
    assert cost.wait_budget_s(Tier.DISK, 4) == pytest.approx(cost.margin * 6.4)  # unchanged
    teach(cost, s_per_token=0.1, remote_latency_s=0.01, remote_s_per_chunk=0.05)
    assert cost.wait_budget_s(Tier.REMOTE, 4) == pytest.approx(2 * (0.01 + 4 * 0.05))


def _on_disk_only(cost: LoadCostModel, keys: list[BlockKey]) -> Rig:
    rig = make_rig(cost=cost)
    rig.store_chunks(keys)
    rig.settle()
    evict_from_cpu(rig, keys)
    return rig


@pytest.mark.parametrize("is_measured", [True, False], ids=["measured-disk", "unmeasured-disk"])
def test_a_disk_promotion_past_its_budget_is_recomputed_and_lands_in_cpu(
    is_measured: bool,
) -> None:
    """A disk that slowed down after it was measured, or one never measured (the budget is
    then the margin): the requester waits its budget, then takes what is in CPU (nothing),
    asks nothing more of the disk, and the promotion lands in CPU for the next request."""
    clock = Clock()
    cost, decisions = model(clock)
    rig = _on_disk_only(cost, ks(1, 2))
    if is_measured:
        teach(cost, s_per_token=0.001, disk_s_per_chunk=0.001)
    else:
        for _ in range(3):
            cost.observe_step(4 * TOKENS, 4 * TOKENS * 0.001)
    budget = cost.wait_budget_s(Tier.DISK, 2)
    assert budget is not None
    assert rig.pipeline.prepare_lookup("r1", ks(1, 2, 3)).is_pending  # the read is submitted
    clock.now += 0.9 * budget
    assert rig.pipeline.prepare_lookup("r1", ks(1, 2, 3)).is_pending  # within its budget
    clock.now += 0.2 * budget
    answer = rig.pipeline.prepare_lookup("r1", ks(1, 2, 3))
    assert not answer.is_pending and answer.tiers == ()
    assert decisions == [(Tier.DISK, "load"), (Tier.DISK, "gave_up")]
    rig.settle()  # the read lands late, in CPU, held by nobody
    assert rig.index.stats().num_holds == 0
    assert rig.pipeline.prepare_lookup("r2", ks(1, 2, 3)).tiers == (Tier.CPU, Tier.CPU)
    evict_from_cpu(rig, ks(1, 2), filler_start=200)  # r1 asks again (preempted): CPU only
    assert rig.pipeline.prepare_lookup("r1", ks(1, 2, 3)).tiers == ()
    assert rig.service.num_pending == 0


def test_a_disk_promotion_within_its_budget_is_never_given_up() -> None:
    clock = Clock()
    cost, decisions = model(clock)
    rig = _on_disk_only(cost, ks(1, 2))
    teach(cost, s_per_token=0.001, disk_s_per_chunk=0.001)
    expected = cost.load_s(Tier.DISK, 2)
    assert expected is not None
    assert rig.pipeline.prepare_lookup("r1", ks(1, 2, 3)).is_pending
    clock.now += 1.5 * expected  # slower than measured, within twice that
    assert rig.pipeline.prepare_lookup("r1", ks(1, 2, 3)).is_pending
    rig.settle()
    assert rig.pipeline.prepare_lookup("r1", ks(1, 2, 3)).tiers == (Tier.DISK, Tier.DISK)
    assert decisions == [(Tier.DISK, "load")]


def _stored_remotely(keys: list[BlockKey]) -> SharedRemote:
    shared = SharedRemote(16)
    writer = make_engine(shared)
    writer.store_chunks(keys)
    writer.settle()
    return shared


def test_an_unmeasured_link_costs_a_request_only_a_fraction_of_its_recompute() -> None:
    clock = Clock()
    cost, decisions = model(clock)
    reader = make_engine(_stored_remotely(ks(1, 2, 3)), cost=cost)
    for _ in range(3):  # the engine's prefill is measured; the link is not
        cost.observe_step(4 * TOKENS, 4 * TOKENS * 0.001)
    assert reader.pipeline.prepare_lookup("r1", ks(1, 2, 3, 4)).is_pending  # probing
    clock.now += 0.5 * EXPLORE_FRACTION * cost.recompute_s(4)  # type: ignore[operator]
    assert reader.pipeline.prepare_lookup("r1", ks(1, 2, 3, 4)).is_pending  # within budget
    clock.now += EXPLORE_FRACTION * cost.recompute_s(4)  # type: ignore[operator]
    answer = reader.pipeline.prepare_lookup("r1", ks(1, 2, 3, 4))
    assert not answer.is_pending and answer.tiers == ()  # recomputed
    assert decisions == [(Tier.REMOTE, "gave_up")]
    assert cost.needs_transfer_sample(Tier.REMOTE)


class SlowLinkTime:
    """`time` for the in-memory remote: each fetch takes a second (a slow link)."""

    def __init__(self) -> None:
        self.now_s = 0.0

    def monotonic(self) -> float:
        self.now_s += 0.5
        return self.now_s


def _gave_up_on_its_probe(
    monkeypatch: pytest.MonkeyPatch, remote_keys: list[BlockKey]
) -> tuple[Engine, LoadCostModel, list[tuple[Tier, str]]]:
    """A reader of a slow link (each remote call takes a second; the sample is 2 chunks) whose
    requester "r1" asked for ks(1, 2, 3, 4) and gave up while its probe was out."""
    monkeypatch.setattr("kvstore.pipeline.remote._SAMPLE_BYTES", 2 * CHUNK_BYTES)
    clock = Clock()
    cost, decisions = model(clock)
    reader = make_engine(_stored_remotely(remote_keys), cost=cost)
    monkeypatch.setattr("kvstore.service.inline_remote.time", SlowLinkTime())
    for _ in range(3):
        cost.observe_step(4 * TOKENS, 4 * TOKENS * 0.001)
    assert reader.pipeline.prepare_lookup("r1", ks(1, 2, 3, 4)).is_pending  # probing
    clock.now += 2 * EXPLORE_FRACTION * cost.recompute_s(4)  # type: ignore[operator]
    assert reader.pipeline.prepare_lookup("r1", ks(1, 2, 3, 4)).tiers == ()  # gave up
    return reader, cost, decisions


def _the_late_answer_measures_the_link(reader: Engine, cost: LoadCostModel) -> None:
    assert reader.service.run_pending()  # the probe answers (late)
    reader.pipeline.poll()
    assert reader.service.num_pending == 1  # the measuring fetch (or read)
    reader.settle()
    assert not cost.needs_transfer_sample(Tier.REMOTE)
    assert reader.index.stats().num_holds == 0  # held by nobody


def test_a_reader_that_gave_up_on_its_probe_fetches_a_few_chunks_to_measure_the_link(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A link whose round trip outlasts the exploring budget: the requester gives up while
    the probe is out. The probe's late answer starts a small fetch (not the whole prefix),
    held by nobody, that measures the link; the next lookup decides on the measurement, and a
    link too slow by it is not even probed again."""
    reader, cost, decisions = _gave_up_on_its_probe(monkeypatch, ks(1, 2, 3))
    _the_late_answer_measures_the_link(reader, cost)
    assert reader.lookup("r2", ks(1, 2)) == (Tier.CPU,) * 2  # 2 chunks landed in CPU, not 3
    assert decisions == [(Tier.REMOTE, "gave_up")]
    # the link's one measured sample is too slow for this engine's prefill: the next lookup
    # does not probe
    assert (cost.floor_s(Tier.REMOTE, 2) or 0.0) > 2 * cost.recompute_s(2)  # type: ignore[operator]
    answer = reader.pipeline.prepare_lookup("r3", ks(1, 2, 3, 4))
    assert not answer.is_pending and answer.tiers == (Tier.CPU,) * 2
    assert reader.service.num_pending == 0  # nothing asked of the remote
    assert decisions[-1] == (Tier.REMOTE, "recompute")


def test_a_probe_answered_after_its_requester_finished_still_measures_the_link(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The requester gave up while its probe was out and finished (a recompute in one step)
    before the answer was applied: the answer still counts as the link's round trip and
    starts the measuring fetch, held by nobody; the next lookup decides on the measurement
    instead of exploring the link again."""
    reader, cost, decisions = _gave_up_on_its_probe(monkeypatch, ks(1, 2, 3))
    reader.pipeline.forget("r1")  # recomputed and finished
    _the_late_answer_measures_the_link(reader, cost)
    answer = reader.pipeline.prepare_lookup("r2", ks(1, 2, 3, 4))
    assert not answer.is_pending and answer.tiers == (Tier.CPU,) * 2  # the sample, in CPU
    assert reader.service.num_pending == 0  # the slow link is not probed again
    assert decisions == [(Tier.REMOTE, "gave_up"), (Tier.REMOTE, "recompute")]


def test_a_link_is_measured_by_a_read_when_the_requester_already_stored_what_it_found(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As above, but the requester's recompute stored the chunks in CPU before the probe's
    answer was applied (one engine step): there is nothing to fetch into rows, so a few of
    them are read only to measure the link; the next lookup of another prefix held by that
    slow link is decided on the measurement, without a probe."""
    reader, cost, decisions = _gave_up_on_its_probe(monkeypatch, ks(1, 2, 3, 5, 6, 7))
    reader.store_chunks(ks(1, 2, 3, 4))  # its recompute, stored
    reader.pipeline.forget("r1")
    _the_late_answer_measures_the_link(reader, cost)  # by a read: no rows to fill
    answer = reader.pipeline.prepare_lookup("r2", ks(5, 6, 7, 8))
    assert not answer.is_pending and answer.tiers == ()
    assert reader.service.num_pending == 0  # the slow link is not probed again
    assert decisions == [(Tier.REMOTE, "gave_up"), (Tier.REMOTE, "recompute")]


def test_a_fetch_past_its_budget_is_recomputed_and_lands_in_cpu_for_the_next() -> None:
    clock = Clock()
    cost, decisions = model(clock)
    reader = make_engine(_stored_remotely(ks(1, 2, 3)), cost=cost)
    teach(cost, s_per_token=0.001, remote_latency_s=0.001, remote_s_per_chunk=0.001)
    assert reader.pipeline.prepare_lookup("r1", ks(1, 2, 3, 4)).is_pending  # probing
    assert reader.service.run_pending()
    assert reader.pipeline.prepare_lookup("r1", ks(1, 2, 3, 4)).is_pending  # fetching
    clock.now += 1.0  # the link slowed down: far past twice the expected 5 ms
    assert reader.pipeline.prepare_lookup("r1", ks(1, 2, 3, 4)).tiers == ()
    assert decisions == [(Tier.REMOTE, "load"), (Tier.REMOTE, "gave_up")]
    reader.settle()
    assert reader.index.stats().num_holds == 0  # nothing held for a request that recomputes
    assert reader.lookup("r2", ks(1, 2, 3, 4)) == (Tier.CPU,) * 3


def test_a_healthy_link_within_its_budget_is_loaded_and_never_given_up() -> None:
    """The give-up stays quiet while the link does what it was measured to do: three
    requesters at once (prefixes of their own), each probe and fetch taking 1.5x the expected
    time (budget: 2x)."""
    clock = Clock()
    cost, decisions = model(clock)
    reader = make_engine(_stored_remotely(ks(1, 2, 3, 4, 5, 6)), cost=cost)
    teach(cost, s_per_token=0.001, remote_latency_s=0.001, remote_s_per_chunk=0.001)
    wanted = {"r1": ks(1, 2, 10), "r2": ks(3, 4, 11), "r3": ks(5, 6, 12)}
    expected = cost.load_s(Tier.REMOTE, 3, round_trips=2)
    assert expected is not None
    answers: dict[str, tuple[Tier, ...]] = {}
    for _ in range(10):
        for owner, keys in wanted.items():
            if owner not in answers:
                answer = reader.pipeline.prepare_lookup(owner, keys)
                if not answer.is_pending:
                    answers[owner] = answer.tiers
        if len(answers) == len(wanted):
            break
        # two rounds (probe, fetch) take 1.5x the expected; each is asked again while in flight
        clock.now += 0.5 * 1.5 * expected
        for owner, keys in wanted.items():
            if owner not in answers:
                assert reader.pipeline.prepare_lookup(owner, keys).is_pending
        reader.service.run_pending()
    assert answers == {owner: (Tier.REMOTE,) * 2 for owner in wanted}
    assert (Tier.REMOTE, "gave_up") not in decisions


def test_the_lookup_waits_on_the_remote_no_longer_than_the_requesters_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`promotion_wait_s` bounds the in-lookup wait for a probe, and so does the requester's
    own budget (a fraction of its recompute on an unmeasured link): a link that does not
    answer holds the scheduler's step only that long."""
    cost, _ = model()
    reader = make_engine(_stored_remotely(ks(1, 2, 3)), cost=cost, promotion_wait_s=5.0)
    for _ in range(3):
        cost.observe_step(4 * TOKENS, 4 * TOKENS * 0.001)
    budget = cost.wait_budget_s(Tier.REMOTE, 4, round_trips=2)  # the 4 keys it asks for
    assert budget is not None and budget < 0.01
    waits: list[float] = []
    drain = reader.service.drain_completions

    def silent(timeout_s: float = 0.0) -> list[Completion]:  # a link that does not answer
        waits.append(timeout_s)
        return drain(0.0)

    monkeypatch.setattr(reader.service, "drain_completions", silent)
    start_s = time.monotonic()
    assert reader.pipeline.prepare_lookup("r1", ks(1, 2, 3, 4)).is_pending
    assert time.monotonic() - start_s < 1.0
    assert waits and max(waits) <= budget


class _SilentRemote:
    """A remote step whose probe never answers, with the requester's budget `left_s`."""

    def __init__(self, left_s: float | None) -> None:
        self.left_s = left_s

    def seconds_left(self, owner: str) -> float | None:
        return self.left_s

    def num_waited_chunks(self, owner: str) -> int | None:
        return 4


@pytest.mark.parametrize(
    ("is_alone", "left_s", "most_s"),
    [(False, 1.0, 0.02), (True, 0.12, 0.12), (True, 5.0, ALONE_WAIT_MAX_S)],
    ids=["beside-others", "alone-within-its-budget", "alone-at-most-the-cap"],
)
def test_the_only_request_waits_on_the_remote_up_to_its_budget(
    is_alone: bool, left_s: float, most_s: float
) -> None:
    """Beside other requests a lookup waits for the remote only `promotion_wait_s`; the only
    request in the engine waits up to its own budget (no one else's step is held up), and
    never past `ALONE_WAIT_MAX_S`; with `promotion_wait_s` 0 no lookup waits, alone or not."""
    no_wait = LookupWaits(time.sleep, None, 0.0)
    start_s = time.monotonic()
    assert no_wait.remote(cast(RemoteSteps, _SilentRemote(left_s)), "r1", None,
                          is_alone=is_alone) is None  # fmt: skip
    assert time.monotonic() - start_s < 0.01
    waits = LookupWaits(time.sleep, None, 0.02)
    start_s = time.monotonic()
    assert waits.remote(cast(RemoteSteps, _SilentRemote(left_s)), "r1", None,
                        is_alone=is_alone) is None  # fmt: skip
    waited_s = time.monotonic() - start_s
    assert 0.8 * most_s < waited_s < most_s + 0.1


def test_an_unmeasured_link_is_fetched_a_sample_first_and_the_rest_once_it_lands(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A link whose speed is not known: the fetch moves a few chunks first. Landing in time,
    they measure the link and the rest follows (one decision counted); a requester that gives
    up meanwhile leaves only those few in flight, not the whole prefix."""
    monkeypatch.setattr("kvstore.pipeline.remote._SAMPLE_BYTES", CHUNK_BYTES)
    for gives_up in (False, True):
        clock = Clock()
        cost, decisions = model(clock)
        reader = make_engine(_stored_remotely(ks(1, 2, 3)), cost=cost)
        for _ in range(3):
            cost.observe_step(4 * TOKENS, 4 * TOKENS * 0.001)
        assert reader.pipeline.prepare_lookup("r1", ks(1, 2, 3, 4)).is_pending  # probing
        assert reader.service.run_pending()
        assert reader.pipeline.prepare_lookup("r1", ks(1, 2, 3, 4)).is_pending  # fetching
        if gives_up:
            clock.now += 1.0
            assert reader.pipeline.prepare_lookup("r1", ks(1, 2, 3, 4)).tiers == ()
            reader.settle()
            assert reader.index.lookup(ks(1, 2, 3)).tiers == (Tier.CPU,)  # the sample, no more
            assert decisions == [(Tier.REMOTE, "load"), (Tier.REMOTE, "gave_up")]
        else:
            assert reader.lookup("r1", ks(1, 2, 3, 4)) == (Tier.REMOTE,) * 3
            assert decisions == [(Tier.REMOTE, "load")]
        assert not cost.needs_transfer_sample(Tier.REMOTE)


def test_a_link_declined_before_is_measured_again_aside_when_its_figures_go_stale(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Figures older than `stale_s` that said the link does not pay: the requester does not
    wait to explore it (it recomputes at once, counted), and the link is probed and sampled
    aside, once, however many requesters ask meanwhile; then its figures are fresh again."""
    monkeypatch.setattr("kvstore.service.inline_remote.time", SlowLinkTime())
    clock = Clock()
    cost, decisions = model(clock)
    reader = make_engine(_stored_remotely(ks(1, 2, 3)), cost=cost)
    teach(cost, s_per_token=0.001, remote_latency_s=0.05, remote_s_per_chunk=0.05)
    assert reader.pipeline.prepare_lookup("r1", ks(1, 2, 3, 4)).tiers == ()
    assert reader.service.num_pending == 0 and decisions == [(Tier.REMOTE, "recompute")]

    clock.now += cost.stale_s + 1  # every figure stale, the engine's prefill too
    for _ in range(3):
        cost.observe_step(4 * TOKENS, 4 * TOKENS * 0.001)
    assert cost.needs_transfer_sample(Tier.REMOTE)
    for owner in ("r2", "r3"):
        answer = reader.pipeline.prepare_lookup(owner, ks(1, 2, 3, 4))
        assert not answer.is_pending and answer.tiers == ()  # nobody waits
    assert reader.service.num_pending == 1  # one probe, aside
    assert decisions[1:] == [(Tier.REMOTE, "recompute")] * 2
    reader.settle()  # the probe, then the sample fetch (the inline link: slow)
    assert not cost.needs_transfer_sample(Tier.REMOTE)
    assert reader.index.stats().num_holds == 0
    assert not reader.pipeline.is_waiting
    answer = reader.pipeline.prepare_lookup("r4", ks(5, 6, 7, 8))  # fresh figures: still slow
    assert not answer.is_pending and reader.service.num_pending == 0
    assert decisions[-1] == (Tier.REMOTE, "recompute")
