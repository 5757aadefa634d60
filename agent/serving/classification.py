"""Triton's classification extension: an output ranked into its top-N classes, the same on
every wire (REST and gRPC answer a request for ``classification`` alike).

NOTE: extension spec:
https://github.com/triton-inference-server/server/blob/main/docs/protocol/extension_classification.md
"""

from __future__ import annotations

import numpy as np

from agent.errors import RequestError

UNCLASSIFIABLE = frozenset({"BYTES", "BOOL"})
"""Datatypes with no order to rank by: a request to classify one is refused before inference."""


def classify(array: np.ndarray, top: int) -> np.ndarray:
    """Triton's classification extension: the top-N ``"<value>:<index>"`` strings per row,
    highest first, equal values in index order.

    Raises:
        RequestError: the array is not numeric (a front end's codec refuses that before
            inference, by :data:`UNCLASSIFIABLE`; this guards other callers).
    """
    if array.dtype.kind not in "iuf":
        raise RequestError(
            f"outputs: classification ranks numeric outputs only, not {array.dtype}",
            field="outputs",
        )
    rows = array.reshape(array.shape[0], -1) if array.ndim > 1 else array.reshape(1, -1)
    top = min(top, rows.shape[1])
    if rows.dtype.kind == "f":
        order = np.argsort(-rows, axis=1, kind="stable")[:, :top]  # NaN stays last
    else:
        # -x wraps for integers (-200 as UINT8 is 56, -(-128) as INT8 is -128): sort the
        # columns reversed, ascending and stable, and read that backwards
        last = rows.shape[1] - 1
        order = last - np.argsort(rows[:, ::-1], axis=1, kind="stable")[:, ::-1][:, :top]
    out = np.empty((rows.shape[0], top), dtype=object)
    for r, indices in enumerate(order):
        for c, index in enumerate(indices):
            out[r, c] = f"{float(rows[r, index]):f}:{int(index)}".encode()
    return out if array.ndim > 1 else out.reshape(top)
