"""The canary's plan and its power (``canary.plan``): pure, no torch."""

from __future__ import annotations

import math

import pytest

from miles_amd.canary import plan as power
from miles_amd.canary.harness import tasks
from miles_amd.canary.kernel import dispatch, wave_class
from miles_amd.canary.plan import (
    ARMS,
    CPU,
    CPU_MAX_TOKENS,
    build_plan,
    control_plan,
    recipe_shape,
    sglang_decode_sizes,
)
from miles_amd.recipe.settings import Recipe
from miles_amd.variants import rollout_implementation


def test_the_shape_comes_from_the_recipe() -> None:
    shape = recipe_shape(Recipe())
    assert (shape.hidden, shape.dtype, shape.tp, shape.engines) == (2880, "bfloat16", 4, 2)
    assert (shape.requests_per_engine, shape.chunked_prefill_size) == (32, 16384)
    for extra in ("--sglang-chunked-prefill-size 4096", "--sglang-chunked-prefill-size=4096"):
        assert recipe_shape(Recipe(extra_args=extra)).chunked_prefill_size == 4096
    assert recipe_shape(Recipe(num_gpus=4)).requests_per_engine == 64
    assert sglang_decode_sizes(30) == [1, 2, 4, 8, 12, 16, 24, 32]  # 30 requests pad to 32
    assert sglang_decode_sizes(64)[-3:] == [48, 56, 64]


def test_the_node_plan_covers_decode_prefill_and_controls() -> None:
    rate = power.implied_rate()
    plan = build_plan(recipe_shape(Recipe()), "aiter", rate, groups=2)
    tokens = [e.tokens for e in plan.entries]
    assert tokens == sorted(set(tokens))
    decode = [e.tokens for e in plan.entries if e.role == "decode"]
    assert decode == [1, 2, 4, 8, 12, 16, 24, 32]  # SGLang's graph sizes up to 32 requests
    for e in plan.entries:
        d = dispatch(e.bytes, 4, 2)
        assert (e.kernel, e.uniform_trip_count, e.affected) == (
            d.kernel,
            d.uniform_trip_count,
            d.affected,
        )
        assert e.wave_class == wave_class(d, 4) and e.exposed == (e.wave_class == "exposed")
        assert e.bytes == 5760 * e.tokens and e.implementation == "aiter" and e.calls > 0
        assert [arm for arm, _ in e.arms] == list(ARMS) and all(c > 0 for _, c in e.arms)
    prefill = [e for e in plan.entries if e.role == "prefill"]
    assert len(prefill) >= 8 and all(e.exposed for e in prefill)
    assert {127, 255, 511, 1023, 2047, 4095, 8191, 11650} <= {e.tokens for e in prefill}
    controls = {e.wave_class for e in plan.entries if e.role == "control"}
    assert controls == {"uniform", "waves-agree", "early-no-read"}  # r = 0, 65..127, lane-only
    assert max(tokens) == 11650  # the largest N aiter's custom all-reduce takes (64 MiB)
    assert plan.exposed_calls >= power.calls_needed(rate)
    assert plan.probability >= 0.99
    assert plan.estimated_seconds < 150  # half the 5 minutes per variant


def test_the_exposed_class_is_the_derivation_of_docs_node_md() -> None:
    """r = 90·N mod 128 in 1..64 and N >= 114 (the block count capped at 80), nothing else."""
    for n in range(1, 11651):
        d = dispatch(5760 * n, 4, 2)
        r = 90 * n % 128
        assert (wave_class(d, 4) == "exposed") == (1 <= r <= 64 and n >= 114), n
        if d.kernel == "2stage" and n >= 114 and r > 64:
            assert wave_class(d, 4) == "waves-agree"
    # a 32-lane wave widens the exposed class
    assert wave_class(dispatch(5760 * 129, 4, 2), 4, 32) == "exposed"  # r = 90: lanes 64..95
    assert wave_class(dispatch(5760 * 129, 4, 2), 4, 64) == "waves-agree"


def test_the_ab_canary_fits_five_node_minutes_per_variant_at_the_restated_power() -> None:
    """stock and patched each: the positive control's run, then the plan with its controls; the
    node's time model takes the harness measured on a GPU."""
    shape = recipe_shape(Recipe())
    for variant in ("stock", "patched"):
        plan = build_plan(shape, rollout_implementation(variant), power.implied_rate(), groups=2)
        assert plan.probability >= 0.99
        seconds = plan.estimated_seconds + control_plan(plan).estimated_seconds
        assert seconds < 5 * 60, variant
    model = plan.latency  # linear between the measured points, proportional beyond the last
    assert model.harness_s(2559) == pytest.approx((237 + (858 - 237) / 2) * 1e-6)
    assert model.harness_s(2 * 11650) == pytest.approx(2 * 2361e-6)


def test_the_control_arm_plan_stops_at_sglangs_size_limit_and_the_cpu_plan_is_small() -> None:
    plan = build_plan(recipe_shape(Recipe()), rollout_implementation("rccl"), 1e-6)
    assert {e.implementation for e in plan.entries} == {"sglang"}
    assert max(e.bytes for e in plan.entries) <= 16 * 1024 * 1024
    plan = build_plan(recipe_shape(Recipe()), "reducer", 0.002, target=CPU)
    assert max(e.tokens for e in plan.entries) <= CPU_MAX_TOKENS
    assert sum(e.calls for e in plan.entries) < 3000
    assert plan.exposed_calls >= 2301
    assert {e.role for e in plan.entries} == {"decode", "prefill", "control"}


def test_tokens_select_sizes_and_refuse_what_the_plan_cannot_use() -> None:
    shape = recipe_shape(Recipe())
    plan = build_plan(shape, "reducer", 0.5, target=CPU, tokens=(127,))
    assert [(e.tokens, e.calls) for e in plan.entries] == [(127, 8)]  # 7 over 4 arms
    with pytest.raises(ValueError, match="suspect class"):
        build_plan(shape, "reducer", 0.5, target=CPU, tokens=(29, 64, 115))  # lane-only sizes
    with pytest.raises(ValueError, match="outside"):
        build_plan(shape, "reducer", 0.5, target=CPU, tokens=(127, 500))


@pytest.mark.parametrize(("p", "n"), [(1e-6, 4605168), (0.002, 2301), (0.5, 7), (0.25, 17)])
def test_calls_needed_and_the_bound_they_buy(p: float, n: int) -> None:
    assert power.calls_needed(p) == n
    assert power.detection_probability(p, n) >= 0.99 > power.detection_probability(p, n - 1)
    bound = power.rate_upper_bound(n)
    assert bound is not None and p >= bound > power.rate_upper_bound(n + 1)  # type: ignore[operator]
    assert abs(power.detection_probability(bound, n) - 0.99) < 1e-9


def test_the_restated_rate_and_rates_outside_the_open_interval() -> None:
    assert power.exposed_calls_per_run() == 20 * 2 * 4 * 49 // 2
    rate = power.implied_rate(0.05, 3920)
    assert (1 - rate) ** 3920 == pytest.approx(0.95, rel=1e-6)  # a wrong sum in 5 % of runs
    assert power.rate_upper_bound(0) is None
    for p in (0.0, 1.0, -0.1, 1.5, math.nan):
        with pytest.raises(ValueError):
            power.calls_needed(p)


def test_allocate_spends_equal_time_on_affected_sizes() -> None:
    times = [1.0, 2.0, 4.0, 1.0]
    calls = power.allocate(times, [True, True, True, False], 700)
    assert sum(c for c, hit in zip(calls, [True, True, True, False], strict=True) if hit) >= 700
    assert calls[:3] == [400, 200, 100]
    assert calls[3] == 40  # CONTROL_SHARE of the affected sizes' time
    with pytest.raises(ValueError):
        power.allocate(times, [False] * 4, 10)


def test_the_tasks_give_every_arm_its_calls_and_spread_the_spread_arm_over_the_run() -> None:
    plan = build_plan(recipe_shape(Recipe()), "aiter", power.implied_rate(), groups=2)
    order = tasks(plan, groups=2)
    for i, entry in enumerate(plan.entries):
        for arm, calls in entry.arms:
            made = sum(t["calls"] for t in order if t["entry"] == i and t["arm"] == arm)
            assert made == -(-calls // 2), (entry.tokens, arm)
    spread = [k for k, t in enumerate(order) if t["arm"] == "spread"]
    assert len(spread) == 8 * len(plan.entries)
    first_size = [k for k in spread if order[k]["entry"] == 0]
    assert first_size[0] < len(order) / 8 and first_size[-1] > len(order) * 3 / 4
