"""RoiAlign against onnxruntime: both coordinate modes, avg and max, regions partly outside the
image, several batch images."""

from __future__ import annotations

import numpy as np
import pytest

from kn_graph.errors import UnsupportedOnnxError
from kn_graph.onnx import load_onnx
from tests.kn_graph.onnx.nn_helpers import check_ort, node_model, rand

ROIS = np.array(
    [[0, 0, 9, 9], [0, 5, 4, 9], [5.5, 5, 9.2, 9], [-2, -1, 3, 14], [2, 2, 2.5, 2.4]], np.float32
)


@pytest.mark.parametrize("coord", ["half_pixel", "output_half_pixel"])
@pytest.mark.parametrize("mode", ["avg", "max"])
def test_roi_align(coord: str, mode: str) -> None:
    feed = {"x": rand(2, 3, 10, 12), "rois": ROIS, "idx": np.array([0, 1, 1, 0, 1], np.int64)}
    attrs = {
        "coordinate_transformation_mode": coord,
        "mode": mode,
        "output_height": 3,
        "output_width": 4,
        "sampling_ratio": 2,
        "spatial_scale": 0.9,
    }
    check_ort("RoiAlign", feed, attrs, opset=16, rtol=1e-4, atol=1e-5)


def test_roi_align_adaptive_sampling_is_refused() -> None:
    feed = {"x": rand(1, 1, 4, 4), "rois": ROIS[:1], "idx": np.zeros(1, np.int64)}
    with pytest.raises(UnsupportedOnnxError, match="adaptive"):
        load_onnx(node_model("RoiAlign", feed, {}, opset=16))
