"""The canary's plan and its power (``canary.plan``, ``canary.power``): pure, no torch."""

from __future__ import annotations

import math

import pytest

from miles_amd.canary import power
from miles_amd.canary.dispatch import dispatch
from miles_amd.canary.plan import CPU, CPU_MAX_TOKENS, build_plan, recipe_shape
from miles_amd.recipe.settings import Recipe
from miles_amd.variants import rollout_implementation


def test_the_shape_comes_from_the_recipe() -> None:
    shape = recipe_shape(Recipe())
    assert (shape.hidden, shape.dtype, shape.tp, shape.engines) == (2880, "bfloat16", 4, 2)
    assert shape.requests_per_engine == 32
    assert shape.chunked_prefill_size == 16384
    custom = recipe_shape(Recipe(extra_args="--sglang-chunked-prefill-size 4096"))
    assert custom.chunked_prefill_size == 4096
    assert recipe_shape(Recipe(num_gpus=4)).requests_per_engine == 64


def test_the_node_plan_covers_decode_prefill_and_controls() -> None:
    plan = build_plan(recipe_shape(Recipe()), "aiter", 1e-6, groups=2)
    tokens = [e.tokens for e in plan.entries]
    assert tokens == sorted(set(tokens))
    assert set(range(1, 33)) <= set(tokens)
    for e in plan.entries:
        d = dispatch(e.bytes, 4, 2)
        assert (e.kernel, e.uniform_trip_count, e.affected) == (
            d.kernel,
            d.uniform_trip_count,
            d.affected,
        )
        assert e.bytes == 5760 * e.tokens and e.implementation == "aiter" and e.calls > 0
    prefill = [e for e in plan.entries if e.role == "prefill"]
    assert len(prefill) >= 10 and all(e.affected for e in prefill)
    controls = [e for e in plan.entries if e.role == "control"]
    assert controls and all(e.kernel == "2stage" and e.uniform_trip_count for e in controls)
    assert any(e.kernel == "1stage" for e in plan.entries)
    assert max(tokens) == 11650  # the largest N aiter's custom all-reduce takes (64 MiB)
    assert plan.affected_calls >= power.calls_needed(1e-6) == 4605168
    assert plan.probability >= 0.99
    assert plan.estimated_seconds < 300  # the 5 minutes, by the published latencies


def test_the_control_arm_plan_stops_at_sglangs_size_limit() -> None:
    plan = build_plan(recipe_shape(Recipe()), rollout_implementation("rccl"), 1e-6)
    assert {e.implementation for e in plan.entries} == {"sglang"}
    assert max(e.bytes for e in plan.entries) <= 16 * 1024 * 1024


def test_the_cpu_plan_is_small_and_keeps_the_classes() -> None:
    plan = build_plan(recipe_shape(Recipe()), "reducer", 0.002, target=CPU)
    assert max(e.tokens for e in plan.entries) <= CPU_MAX_TOKENS
    assert sum(e.calls for e in plan.entries) < 3000
    assert plan.affected_calls >= 2301
    assert {e.role for e in plan.entries} == {"decode", "prefill", "control"}


def test_tokens_select_sizes_and_refuse_what_the_plan_cannot_use() -> None:
    shape = recipe_shape(Recipe())
    plan = build_plan(shape, "reducer", 0.5, target=CPU, tokens=(29,))
    assert [(e.tokens, e.calls) for e in plan.entries] == [(29, 7)]
    with pytest.raises(ValueError, match="suspect class"):
        build_plan(shape, "reducer", 0.5, target=CPU, tokens=(1, 64))
    with pytest.raises(ValueError, match="outside"):
        build_plan(shape, "reducer", 0.5, target=CPU, tokens=(29, 500))


@pytest.mark.parametrize(("p", "n"), [(1e-6, 4605168), (0.002, 2301), (0.5, 7), (0.25, 17)])
def test_calls_needed(p: float, n: int) -> None:
    assert power.calls_needed(p) == n
    assert power.detection_probability(p, n) >= 0.99 > power.detection_probability(p, n - 1)


@pytest.mark.parametrize("p", [0.0, 1.0, -0.1, 1.5, math.nan])
def test_rates_outside_the_open_interval_are_refused(p: float) -> None:
    with pytest.raises(ValueError):
        power.calls_needed(p)


def test_rate_upper_bound_inverts_the_detection_probability() -> None:
    bound = power.rate_upper_bound(2301)
    assert bound is not None and abs(power.detection_probability(bound, 2301) - 0.99) < 1e-9
    assert power.rate_upper_bound(0) is None


def test_allocate_spends_equal_time_on_affected_sizes() -> None:
    times = [1.0, 2.0, 4.0, 1.0]
    calls = power.allocate(times, [True, True, True, False], 700)
    assert sum(c for c, hit in zip(calls, [True, True, True, False], strict=True) if hit) >= 700
    assert calls[:3] == [400, 200, 100]
    assert calls[3] == 40  # CONTROL_SHARE of the affected sizes' time
    with pytest.raises(ValueError):
        power.allocate(times, [False] * 4, 10)
