"""DeformConv against the ONNX reference implementation: offsets moving taps between and outside
pixels, masks, bias, groups and offset groups, strides, pads and dilations."""

from __future__ import annotations

import numpy as np
import pytest

from kn_graph.errors import UnsupportedOnnxError
from kn_graph.onnx import load_onnx
from tests.kn_graph.onnx.nn_helpers import check_reference, node_model, rand


@pytest.mark.parametrize(
    ("attrs", "c", "oc"),
    [
        ({}, 2, 3),
        ({"pads": [1, 0, 1, 2], "strides": [2, 1]}, 2, 2),
        ({"dilations": [2, 1], "group": 2, "offset_group": 2}, 4, 2),
    ],
)
@pytest.mark.parametrize("with_mask", [False, True])
def test_deform_conv(attrs: dict[str, object], c: int, oc: int, with_mask: bool) -> None:
    h, w, k = 5, 6, (2, 3)
    pads = attrs.get("pads", [0, 0, 0, 0])
    strides = attrs.get("strides", [1, 1])
    dil = attrs.get("dilations", [1, 1])
    group, og = int(attrs.get("group", 1)), int(attrs.get("offset_group", 1))  # type: ignore[call-overload]
    out = [
        (n + pads[i] + pads[i + 2] - dil[i] * (k[i] - 1) - 1) // strides[i] + 1  # type: ignore[index]
        for i, n in enumerate((h, w))
    ]
    feed = {
        "x": rand(2, c, h, w),
        "w": rand(oc, c // group, *k),
        "offset": rand(2, og * 6 * 2, *out) * 1.5,
    }
    order = ["x", "w", "offset", "b"]
    inits = {"b": rand(oc)}
    if with_mask:
        feed["mask"] = np.abs(rand(2, og * 6, *out))
        order.append("mask")
    check_reference(
        "DeformConv", feed, attrs, inits=inits, order=order, opset=22, rtol=1e-4, atol=1e-5
    )


def test_deform_conv_3d_is_refused() -> None:
    model = node_model(
        "DeformConv",
        {"x": rand(1, 1, 3, 3, 3), "w": rand(1, 1, 2, 2, 2), "o": rand(1, 24, 2, 2, 2)},
        opset=22,
    )
    with pytest.raises(UnsupportedOnnxError):
        load_onnx(model)
