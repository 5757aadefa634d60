"""Input sketches and the drift measures, against ddsketch, numpy and scipy on known
distributions."""

from __future__ import annotations

import numpy as np
import pytest
from ddsketch import DDSketch, LogarithmicMapping
from scipy.stats import ks_2samp, wasserstein_distance

from agent.inference.sketches import InputSketchBook, InputSketchSettings
from common.protocol.drift import InputSketch
from common.protocol.messages import ModelTelemetry, Telemetry
from common.sketching import ALL_VALUES, bin_keys, feature_matrix, key_values
from control_plane.ingest.decode import FastDecoder
from control_plane.quality.drift import (
    Distribution,
    distribution,
    ks,
    psi,
    sketch_bins,
    values_bins,
    wasserstein,
)

RNG = np.random.default_rng(7)


def unit(values: np.ndarray) -> Distribution:
    uniq, counts = np.unique(values, return_counts=True)
    return Distribution(uniq, counts.astype(np.float64))


def numpy_psi(live: np.ndarray, ref: np.ndarray, bins: int = 10) -> float:
    """The textbook PSI: decile edges of the reference, shares floored at 1e-4."""
    edges = np.unique(np.quantile(ref, np.arange(1, bins) / bins, method="inverted_cdf"))
    a = np.bincount(np.searchsorted(edges, live), minlength=len(edges) + 1) / len(live)
    e = np.bincount(np.searchsorted(edges, ref), minlength=len(edges) + 1) / len(ref)
    a, e = np.maximum(a, 1e-4), np.maximum(e, 1e-4)
    return float(np.sum((a - e) * np.log(a / e)))


def test_vectorised_bins_are_ddsketchs_own() -> None:
    values = np.concatenate([RNG.lognormal(0, 4, 20_000), -RNG.lognormal(0, 2, 5_000), [0.0]])
    mapping = LogarithmicMapping(0.02)
    zero, keys, counts, nkeys, ncounts = bin_keys(values, 0.02)
    expected: dict[int, int] = {}
    for v in values[values > 0]:
        expected[mapping.key(v)] = expected.get(mapping.key(v), 0) + 1
    assert dict(zip(keys.tolist(), counts.tolist(), strict=True)) == expected
    assert zero == 1 and ncounts.sum() == 5_000
    assert np.allclose(key_values(keys, 0.02), [mapping.value(k) for k in keys.tolist()])


def test_the_books_sketch_has_the_window_mean_variance_and_quantiles() -> None:
    book = InputSketchBook(InputSketchSettings(sample_rows_per_window=100_000))
    data = RNG.normal(5.0, 2.0, (2_000, 4)).astype(np.float32)
    for start in range(0, len(data), 10):
        book.observe("m", 1, {"x": data[start : start + 10]})
    (sketch,) = book.take_all()[("m", 1)].inputs
    assert book.take_all() == {}  # the next window starts empty
    assert (sketch.rows, sketch.sampled_rows, sketch.layout) == (2_000, 2_000, "features")
    assert [f.feature for f in sketch.features] == [ALL_VALUES, 0, 1, 2, 3]
    f0 = sketch.features[1]
    assert f0.mean == pytest.approx(float(data[:, 0].mean()), rel=1e-5)
    assert f0.variance == pytest.approx(float(data[:, 0].var()), rel=1e-4)
    # quantiles through the library, rebuilt from the wire's bins: within its accuracy
    rebuilt = DDSketch(relative_accuracy=0.02)
    for value, count in sketch_bins(f0, 0.02).items():
        rebuilt.add(value, count)
    for q in (0.1, 0.5, 0.9):
        exact = float(np.quantile(data[:, 0], q, method="lower"))
        assert rebuilt.get_quantile_value(q) == pytest.approx(exact, rel=0.021, abs=0.05)


def test_past_the_budget_requests_are_sampled_across_the_whole_window() -> None:
    book = InputSketchBook(InputSketchSettings(sample_rows_per_window=200))
    for i in range(4_000):  # the first half of the window is 0s, the second half 10s
        book.observe("m", 1, {"x": np.full((1, 2), 0.0 if i < 2_000 else 10.0)})
    (sketch,) = book.take_all()[("m", 1)].inputs
    assert sketch.rows == 4_000 and sketch.sampled_rows == 200
    tens = sum(sketch.features[1].counts)  # positive bins: the 10s
    assert 60 <= tens <= 140, tens  # about half; not the first 200 requests only


def test_features_are_columns_or_channels() -> None:
    nchw = np.zeros((2, 3, 8, 8))
    nchw[:, 1] = 1.0
    matrix, layout = feature_matrix(nchw, 8, 16)
    assert layout == "channels" and matrix.shape == (2 * 16, 3)
    assert matrix[:, 1].min() == 1.0 and matrix[:, 0].max() == 0.0
    nhwc = np.moveaxis(nchw, 1, 3)
    matrix, layout = feature_matrix(nhwc, 2, 64)
    assert layout == "channels" and matrix.shape == (2 * 64, 2) and matrix[:, 1].min() == 1.0
    matrix, layout = feature_matrix(np.arange(20.0).reshape(2, 10), 3, 64)
    assert layout == "features" and matrix.tolist() == [[0, 1, 2], [10, 11, 12]]
    assert feature_matrix(np.array(["a"]), 3, 64)[0].size == 0


def test_ks_and_wasserstein_agree_with_scipy() -> None:
    ref = RNG.normal(0, 1, 3_000).round(2)
    for live in (RNG.normal(0, 1, 2_000).round(2), RNG.normal(0.5, 1.3, 2_000).round(2)):
        assert ks(unit(live), unit(ref)) == pytest.approx(ks_2samp(live, ref).statistic)
        assert wasserstein(unit(live), unit(ref)) == pytest.approx(wasserstein_distance(live, ref))


def test_psi_agrees_with_the_textbook_formula_on_known_distributions() -> None:
    ref = RNG.normal(0, 1, 10_000)
    same = RNG.normal(0, 1, 10_000)
    shifted = RNG.normal(1, 1, 10_000)
    for live in (same, shifted):
        assert psi(unit(live), unit(ref)) == pytest.approx(numpy_psi(live, ref), rel=1e-9)
    assert psi(unit(same), unit(ref)) < 0.01
    # a shift of one standard deviation: PSI about 1 (the 10-bin value for N(1,1) vs N(0,1))
    assert 0.8 < psi(unit(shifted), unit(ref)) < 1.3


def test_binned_like_the_agent_drift_stays_close_to_the_raw_values() -> None:
    ref = RNG.normal(3, 1, 5_000)
    live = RNG.normal(3.4, 1, 5_000)
    binned = [distribution(values_bins(v, 0.02)) for v in (live, ref)]
    assert psi(*binned) == pytest.approx(psi(unit(live), unit(ref)), abs=0.03)
    assert ks(*binned) == pytest.approx(ks(unit(live), unit(ref)), abs=0.02)


def test_sketches_cross_the_wire_and_the_fast_decoder() -> None:
    book = InputSketchBook(InputSketchSettings())
    book.observe("m", 1, {"x": RNG.normal(0, 1, (50, 64)).astype(np.float32)})
    sketches = book.take_all()[("m", 1)].inputs
    message = Telemetry(
        device_id="d",
        seq=1,
        time="2026-12-06T00:00:00Z",
        window_s=1.0,
        models=[
            ModelTelemetry(
                model="m", version=1, requests=1, errors=0, rows=50, batches=1, inputs=sketches
            )
        ],
    )
    payload = message.model_dump_json().encode()
    fast = FastDecoder(Telemetry).decode(payload)
    assert fast is not None
    (got,) = fast.models[0].inputs
    assert InputSketch.model_validate(got, from_attributes=True) == sketches[0]
    assert len(payload) < 8_000  # 9 sketches of 50 rows of normal values, 2 % bins


def test_the_rollout_status_names_the_drift_gates_numbers() -> None:
    from control_plane.status_view import gate_words

    doc = {
        "current_wave": 0,
        "gates": {"max_error_rate": 0.01, "max_p99_ratio": 2.0, "min_requests": 20},
        "gate_report": {
            "0": {
                "requests": 300,
                "errors": 0,
                "error_rate": 0.0,
                "drift": {"psi": 0.031, "feature": "input[4]", "device_id": "d1", "max_drift": 0.2},
            }
        },
    }
    words = gate_words(doc)
    assert words is not None and "input drift PSI 0.031 on input[4] at d1 (limit 0.2)" in words


def test_outputs_and_their_top1_classes_are_sketched_beside_the_inputs() -> None:
    book = InputSketchBook(InputSketchSettings())
    scores = np.zeros((40, 5), np.float32)
    scores[:30, 2] = scores[30:, 4] = 1.0  # 30 rows predict class 2, 10 class 4
    book.observe("m", 1, {"x": np.ones((40, 3), np.float32)}, {"p": scores, "v": scores[:, 0]})
    taken = book.take_all()[("m", 1)]
    assert [s.name for s in taken.inputs] == ["x"]
    assert [s.name for s in taken.outputs] == ["p", "v"]
    (top1,) = taken.top1  # of the [N, classes] output only
    assert top1.name == "p" and top1.rows == 40
    (classes,) = [f for f in top1.features if f.feature == -1]
    assert classes.count == 40 and classes.mean == pytest.approx((30 * 2 + 10 * 4) / 40)
    off = InputSketchBook(InputSketchSettings(outputs=False))
    off.observe("m", 1, {"x": np.ones((4, 3), np.float32)}, {"p": scores[:4]})
    assert off.take_all()[("m", 1)][1:] == ([], [])
