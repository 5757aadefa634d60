"""The decoded-pixel budget shared by every request's image steps, without threads: a decode
holds its request's pixels while its images live, and one past the budget is refused (503)
while others hold it."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from common.pipeline_steps import DecodeBudget, DecodeBusyError


def test_pixels_are_held_while_the_images_live_and_given_back_after() -> None:
    budget = DecodeBudget(max_pixels=1000)
    first = np.empty(2, dtype=object)
    budget.take("decode", 600, first)
    assert budget.held == 600
    with pytest.raises(DecodeBusyError, match="600 pixels of other requests' images"):
        budget.take("decode", 500, np.empty(1, dtype=object))
    assert budget.held == 600  # a refusal holds nothing
    second = np.empty(1, dtype=object)
    budget.take("decode", 400, second)  # exactly at the budget
    del first
    gc.collect()
    assert budget.held == 400
    del second
    gc.collect()
    assert budget.held == 0


def test_one_request_alone_may_decode_past_the_budget() -> None:
    """Its own limit is max_request_pixels; the shared budget must not refuse it forever."""
    budget = DecodeBudget(max_pixels=100)
    images = np.empty(1, dtype=object)
    budget.take("decode", 500, images)
    assert budget.held == 500
    with pytest.raises(DecodeBusyError) as refused:
        budget.take("decode", 1, np.empty(1, dtype=object))
    assert refused.value.code == "decode_budget_full" and refused.value.retry_after_s == 1
