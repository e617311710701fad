#!/usr/bin/env python3
"""Developer-run generator for kyanite's ONNX test fixtures.

This script is NOT run by CI.  It builds small models with random weights
(from configs / constructors only, nothing is downloaded), exports each one to
ONNX with the TorchScript exporter (``dynamo=False``) and with the dynamo
exporter (``dynamo=True``), computes reference outputs with onnxruntime and
writes the results next to this file (or into ``--out``):

* ``<name>.onnx``      the model, weights embedded (no external data files)
* ``<name>.npz``       reference data; for every data set k (k=0, and k=1 when
                       the model has dynamic dims) arrays ``in{k}:<input>`` and
                       ``out{k}:<output>``; outputs computed by onnxruntime
* ``manifest.json``    one entry per fixture: architecture, exporter, opset,
                       dim_param names per input/output axis, the bindings of
                       those dim_params for each data set, names / dtypes /
                       shapes / output std per data set, node count, op types;
                       plus ``skipped`` (fixture -> reason) for exports that failed.

How to run (from the repository root)::

    python3 -m venv /work/venv-fx
    /work/venv-fx/bin/pip install torch==2.13.0      # CPU wheel
    /work/venv-fx/bin/pip install transformers diffusers 'onnx~=1.23.0' \
        onnxruntime onnxscript numpy
    /work/venv-fx/bin/python tests/models/make_models.py [--out DIR] [--only NAME ...]

``--only`` takes fixture names, base names (``kv_llm``) or a group, ``dynamic_shapes`` (the
eight dynamic-shape fixtures below) or ``control_flow`` (five below); their manifest entries
replace those of the same name in an existing ``manifest.json`` and all other entries are kept.
A fixture's input data seed is fixed by its position in ``MODELS``, so ``--only`` reproduces a
full run's data.  When this run's package versions differ from the manifest's ``versions``
(the ones that made the other fixtures), the new entries record theirs under ``versions``.

Besides the batch(/seq)-dynamic exports, the ``dynamic_shapes`` group exercises dynamic
shapes as real exports use them: CNNs with dynamic batch/height/width (``resnet_hw_dynamo``,
``mobilenetv3_hw_dynamo``, ``convnext_hw_dynamo``), a YOLO-style detector whose height/width
are exported as ``32*h32`` / ``32*w32`` (``yolo_hw_dynamo``), a wav2vec2-style front end with
a dynamic sample count (``audio_frontend_dynamo``), a BERT whose ``attention_mask`` carries
dim_params independent of ``input_ids``' (``bert_indep_dynamo``, renamed after export), a
KV-cache decoder step with dynamic ``past`` and mask length ``past + 1``
(``kv_llm_dynamo``; its npz also holds ``greedy:prompt`` / ``greedy:tokens``, a 10-step
onnxruntime greedy decode from an empty cache, described by the manifest entry's
``greedy``), and a hand-built graph whose Resize sizes and Reshape shape are graph inputs
(``shape_inputs``; exporter ``onnx.helper``).  Their bindings are deliberately not powers
of two.  Spec hooks used by them: ``dim_ranges`` (Dim min/max), ``dynamo_shapes`` (custom /
derived Dims), ``post_export`` (edit the saved file), ``onnx_builder`` and ``extra``
(additional npz arrays and manifest keys).

The ``control_flow`` group has control flow and run-time (data-dependent) sizes; each has
two data sets whose run-time sizes differ:

* ``detector_ts``: torchvision's RetinaNet (``weights=None``, ``weights_backbone=None``) with a
  tiny custom backbone and its whole eval path (GeneralizedRCNNTransform resize with computed
  sizes, score threshold -> NonZero, TopK, box decoding, batched NMS -> NonMaxSuppression inside
  an If), TorchScript export; the detection count is a run-time size.  It needs torchvision,
  which must not go beside torch 2.13 (see below), so it is made in a venv of its own with
  torch 2.14.1 + torchvision 0.29.1 (the releases whose wheels pip finds together; PyPI's
  torchvision 0.28 does not import beside the torch 2.13 CPU wheel)::

      python3 -m venv /work/venv-tv
      /work/venv-tv/bin/pip install torch==2.14.1 torchvision==0.29.1 'onnx~=1.23.0' \
          onnxruntime==1.32.0 onnxscript numpy
      /work/venv-tv/bin/python tests/models/make_models.py --only detector_ts

  Its manifest entry records those versions under ``versions``.  A run whose interpreter lacks
  a package in ``REQUIRES`` (torchvision for ``detector``) keeps that fixture's files and
  manifest entry as they are.
* ``yolo_nms``: the TinyYolo backbone with an end-to-end NMS tail; NonMaxSuppression comes
  from a ``torch.autograd.Function`` whose ``symbolic`` emits the ONNX op (eager:
  ``nms_reference``, onnxruntime's algorithm in numpy), TorchScript export.
* ``if_data``: a ``torch.jit.script``'ed module with a data-dependent ``if`` (ONNX If) whose
  branches give different row counts.
* ``loop_decode``: a scripted greedy decoder (ONNX Loop with a data-dependent stop condition;
  TorchScript writes the per-step lists as loop-carried sequences, SequenceInsert in the body
  and ConcatFromSequence after it, not as scan outputs); different iteration counts.
* ``scan_rnn``: torch exports loops as Loop, so this one is built with onnx.helper: two Scans
  (forward, backward) whose bodies are TorchScript-exported GRU cell graphs; the scan length is
  the dim_param ``seq``; its eager reference is a torch loop.

Index-like outputs (``yolo_nms``'s selected_indices, ``detector_ts``'s scores, probabilities
above a threshold) are exempt from the std check through the spec key ``std_unchecked``.

Versions used for the committed fixtures: torch 2.13.0+cpu, transformers 5.24.0,
diffusers 0.42.1, onnx 1.23.2, onnxruntime 1.32.0, onnxscript 0.7.2, numpy 2.4 (``detector_ts``:
torch 2.14.1, torchvision 0.29.1, as above).
Do not install torchvision beside torch 2.13 (it breaks ``import transformers``);
ResNet-18 and MobileNetV2 are written out below in plain torch.

Everything is seeded, so re-running reproduces the same weights and inputs
(the ONNX files may still differ in node names between exporter versions).
Each fixture is checked: onnxruntime vs torch eager (max abs diff printed, a
relative disagreement above 1e-3 fails that fixture), every output std must lie
in [0.1, 100] (except a spec's ``std_unchecked`` outputs), and the total size of the output directory must stay <= 20 MB.
A failure of one model/exporter is recorded under ``skipped`` in the manifest
and the script goes on.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
import traceback
import warnings
from collections import OrderedDict

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

# silence "torchvision is not installed. Skipping torchvision::nms" and friends
logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)

warnings.filterwarnings("ignore")
torch.set_num_threads(2)

HERE = os.path.dirname(os.path.abspath(__file__))
TS_OPSET = 17
DYNAMO_OPSET = 18
STD_RANGE = (0.1, 100.0)
REL_TOL = 1e-3
MAX_TOTAL_BYTES = 20 * 1024 * 1024
STRIP = {"strip_node_metadata": True}


# --------------------------------------------------------------------------
# CNNs written out in plain torch (no torchvision)
# --------------------------------------------------------------------------


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x):
        idt = x if self.downsample is None else self.downsample(x)
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + idt)


class ResNet18(nn.Module):
    """torchvision's resnet18 topology with a configurable base width."""

    def __init__(self, width=16, num_classes=10):
        super().__init__()
        w = width
        self.conv1 = nn.Conv2d(3, w, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(w)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        layers, cin = [], w
        for i, cout in enumerate([w, 2 * w, 4 * w, 8 * w]):
            stride = 1 if i == 0 else 2
            layers.append(nn.Sequential(BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)))
            cin = cout
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8 * w, num_classes)

    def forward(self, x):
        x = self.maxpool(F.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(x)


def _make_divisible(v, divisor=8, min_value=None):
    min_value = min_value or divisor
    new_v = max(min_value, int(v + divisor / 2) // divisor * divisor)
    if new_v < 0.9 * v:
        new_v += divisor
    return new_v


class ConvBNReLU6(nn.Sequential):
    def __init__(self, cin, cout, k=3, stride=1, groups=1):
        super().__init__(
            nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False),
            nn.BatchNorm2d(cout),
            nn.ReLU6(inplace=False),
        )


class InvertedResidual(nn.Module):
    def __init__(self, cin, cout, stride, expand):
        super().__init__()
        hidden = int(round(cin * expand))
        self.use_res = stride == 1 and cin == cout
        layers = []
        if expand != 1:
            layers.append(ConvBNReLU6(cin, hidden, k=1))
        layers += [
            ConvBNReLU6(hidden, hidden, stride=stride, groups=hidden),
            nn.Conv2d(hidden, cout, 1, 1, 0, bias=False),
            nn.BatchNorm2d(cout),
        ]
        self.conv = nn.Sequential(*layers)

    def forward(self, x):
        return x + self.conv(x) if self.use_res else self.conv(x)


class MobileNetV2(nn.Module):
    """torchvision's mobilenet_v2 topology with a width multiplier."""

    def __init__(self, width_mult=0.35, num_classes=10, last_channel=1280):
        super().__init__()
        setting = [
            [1, 16, 1, 1],
            [6, 24, 2, 2],
            [6, 32, 3, 2],
            [6, 64, 4, 2],
            [6, 96, 3, 1],
            [6, 160, 3, 2],
            [6, 320, 1, 1],
        ]
        cin = _make_divisible(32 * width_mult)
        self.last_channel = _make_divisible(last_channel * max(1.0, width_mult))
        feats = [ConvBNReLU6(3, cin, stride=2)]
        for t, c, n, s in setting:
            cout = _make_divisible(c * width_mult)
            for i in range(n):
                feats.append(InvertedResidual(cin, cout, s if i == 0 else 1, t))
                cin = cout
        feats.append(ConvBNReLU6(cin, self.last_channel, k=1))
        self.features = nn.Sequential(*feats)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(self.last_channel, num_classes))

    def forward(self, x):
        x = self.features(x)
        x = F.adaptive_avg_pool2d(x, (1, 1))
        return self.classifier(torch.flatten(x, 1))


def calibrate_batchnorm(model, shape, seed):
    """Give BatchNorms realistic statistics: estimate running stats from random
    data (as training would), then randomise the affine parameters."""
    g = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.reset_running_stats()
            m.momentum = None  # cumulative average
    model.train()
    with torch.no_grad():
        for _ in range(4):
            model(torch.randn(*shape, generator=g))
    model.eval()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                c = m.num_features
                m.weight.copy_(torch.rand(c, generator=g) * 1.0 + 0.5)
                m.bias.copy_(torch.randn(c, generator=g) * 0.2)
                # perturb the estimated stats a little so they are not exact
                m.running_mean.add_(torch.randn(c, generator=g) * 0.05)
                m.running_var.mul_(torch.rand(c, generator=g) * 0.4 + 0.8)
                m.momentum = 0.1
    return model


# The tiny SD configurations, shared with examples/make_tiny_sd.py (the shipped pipeline).
# (32, 64) channels would cost 3.3 MB per export; diffusers reads attention_head_dim as the
# number of heads here (8 heads of 2 and 4 channels).
TINY_UNET_CONFIG = dict(
    sample_size=16,
    in_channels=4,
    out_channels=4,
    block_out_channels=(16, 32),
    layers_per_block=1,
    down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
    up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
    cross_attention_dim=32,
    attention_head_dim=8,
    norm_num_groups=8,
)
TINY_VAE_CONFIG = dict(
    in_channels=3,
    out_channels=3,
    latent_channels=4,
    block_out_channels=(16, 32),
    layers_per_block=1,
    norm_num_groups=8,
    down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
    up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
    sample_size=32,
)


def rerandomise_zero_params(model, seed, std=0.05):
    """Diffusers zero-initialises e.g. proj_out / conv_out layers; give every
    all-zero weight tensor (ndim >= 2) a random value so outputs are not trivial."""
    g = torch.Generator().manual_seed(seed)
    n = 0
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim >= 2 and torch.count_nonzero(p) == 0:
                fan_in = p[0].numel()
                p.copy_(torch.randn(p.shape, generator=g) / np.sqrt(fan_in))
                n += 1
            elif p.ndim == 1 and name.endswith("bias") and torch.count_nonzero(p) == 0:
                p.copy_(torch.randn(p.shape, generator=g) * std)
    return n


# --------------------------------------------------------------------------
# Wrappers returning plain tuples of tensors
# --------------------------------------------------------------------------


class HFTextWrapper(nn.Module):
    def __init__(self, model, input_names, output_attrs):
        super().__init__()
        self.model = model
        self.input_names = input_names
        self.output_attrs = output_attrs

    def forward(self, *args):
        out = self.model(**dict(zip(self.input_names, args)), return_dict=True)
        return tuple(getattr(out, a) for a in self.output_attrs)


class BertWrapper(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, token_type_ids):
        o = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            return_dict=True,
        )
        return o.last_hidden_state, o.pooler_output


class CausalLMWrapper(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        o = self.model(
            input_ids=input_ids, attention_mask=attention_mask, use_cache=False, return_dict=True
        )
        return (o.last_hidden_state,)


class ClipTextWrapper(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        o = self.model(input_ids=input_ids, return_dict=True)
        return o.last_hidden_state, o.pooler_output


class UNetWrapper(nn.Module):
    def __init__(self, unet):
        super().__init__()
        self.unet = unet

    def forward(self, sample, timestep, encoder_hidden_states):
        return (self.unet(sample, timestep, encoder_hidden_states, return_dict=False)[0],)


class VaeDecoderWrapper(nn.Module):
    def __init__(self, vae):
        super().__init__()
        self.vae = vae

    def forward(self, latent):
        return (self.vae.decode(latent).sample,)


# --------------------------------------------------------------------------
# Input generation
# --------------------------------------------------------------------------


def token_ids(rng, b, s, vocab):
    return rng.integers(0, vocab, size=(b, s), dtype=np.int64)


def padding_mask(b, s, pad):
    """1 = attend, 0 = padding; row i gets pad[i] trailing zeros (right padding)."""
    m = np.ones((b, s), dtype=np.int64)
    for i, p in enumerate(pad[:b]):
        if p:
            m[i, s - p :] = 0
    return m


# Each spec: builder() -> (module, input_names, output_names, make_inputs(kind, rng)
# -> dict name->np.ndarray, dynamic: {input: {axis: dimname}})
# kind is "export" (shapes used for tracing), 0 or 1 (data sets).


def spec_resnet18():
    torch.manual_seed(1)
    m = ResNet18(width=8, num_classes=10)  # width 16 would cost 2.8 MB per export
    calibrate_batchnorm(m, (8, 3, 64, 64), seed=11)
    batches = {"export": 2, 0: 1, 1: 3}

    def inputs(kind, rng):
        return {"input": rng.standard_normal((batches[kind], 3, 64, 64)).astype(np.float32)}

    return dict(
        arch="ResNet-18 (BasicBlock x [2,2,2,2], base width 8, 10 classes), 3x64x64",
        module=m,
        input_names=["input"],
        output_names=["logits"],
        inputs=inputs,
        dynamic={"input": {0: "batch"}},
        dynamic_out={"logits": {0: "batch"}},
    )


def spec_mobilenetv2():
    torch.manual_seed(2)
    m = MobileNetV2(width_mult=0.35, num_classes=10)
    calibrate_batchnorm(m, (8, 3, 64, 64), seed=12)
    batches = {"export": 2, 0: 1, 1: 3}

    def inputs(kind, rng):
        return {"input": rng.standard_normal((batches[kind], 3, 64, 64)).astype(np.float32)}

    return dict(
        arch="MobileNetV2 (width 0.35, last channel 1280, 10 classes), 3x64x64",
        module=m,
        input_names=["input"],
        output_names=["logits"],
        inputs=inputs,
        dynamic={"input": {0: "batch"}},
        dynamic_out={"logits": {0: "batch"}},
    )


def tiny_bert_config(config_cls, vocab: int, hidden: int):
    """A 2-layer, 4-head BERT configuration without dropout, eager attention."""
    cfg = config_cls(
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=2 * hidden,
        max_position_embeddings=64,
        type_vocab_size=2,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    cfg._attn_implementation = "eager"
    return cfg


SEQ_SHAPES = {"export": (2, 9), 0: (1, 7), 1: (3, 12)}
PADS = {"export": [0, 3], 0: [0], 1: [0, 4, 9]}


def spec_bert():
    from transformers import BertConfig, BertModel

    torch.manual_seed(3)
    cfg = tiny_bert_config(BertConfig, vocab=1000, hidden=64)
    m = BertWrapper(BertModel(cfg).eval())

    def inputs(kind, rng):
        b, s = SEQ_SHAPES[kind]
        tt = np.zeros((b, s), dtype=np.int64)
        tt[:, s // 2 :] = 1
        return {
            "input_ids": token_ids(rng, b, s, cfg.vocab_size),
            "attention_mask": padding_mask(b, s, PADS[kind]),
            "token_type_ids": tt,
        }

    bs = {0: "batch", 1: "seq"}
    return dict(
        arch="transformers BertModel (hidden 64, 2 layers, 4 heads, ffn 128, vocab 1000)",
        module=m,
        input_names=["input_ids", "attention_mask", "token_type_ids"],
        output_names=["last_hidden_state", "pooler_output"],
        inputs=inputs,
        dynamic={"input_ids": bs, "attention_mask": bs, "token_type_ids": bs},
        dynamic_out={"last_hidden_state": bs, "pooler_output": {0: "batch"}},
    )


def spec_gpt2():
    from transformers import GPT2Config, GPT2Model

    torch.manual_seed(4)
    cfg = GPT2Config(
        vocab_size=1000,
        n_positions=64,
        n_embd=64,
        n_layer=2,
        n_head=4,
        n_inner=128,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        use_cache=False,
    )
    cfg._attn_implementation = "eager"
    m = CausalLMWrapper(GPT2Model(cfg).eval())

    def inputs(kind, rng):
        b, s = SEQ_SHAPES[kind]
        return {
            "input_ids": token_ids(rng, b, s, cfg.vocab_size),
            "attention_mask": padding_mask(b, s, PADS[kind]),
        }

    bs = {0: "batch", 1: "seq"}
    return dict(
        arch="transformers GPT2Model (n_embd 64, 2 layers, 4 heads, n_inner 128, vocab 1000), no KV cache",
        module=m,
        input_names=["input_ids", "attention_mask"],
        output_names=["last_hidden_state"],
        inputs=inputs,
        dynamic={"input_ids": bs, "attention_mask": bs},
        dynamic_out={"last_hidden_state": bs},
    )


def spec_llama():
    from transformers import LlamaConfig, LlamaModel

    torch.manual_seed(5)
    cfg = LlamaConfig(
        vocab_size=1000,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        rope_theta=10000.0,
        use_cache=False,
        attention_dropout=0.0,
    )
    cfg._attn_implementation = "eager"
    m = CausalLMWrapper(LlamaModel(cfg).eval())

    def inputs(kind, rng):
        b, s = SEQ_SHAPES[kind]
        return {
            "input_ids": token_ids(rng, b, s, cfg.vocab_size),
            "attention_mask": padding_mask(b, s, PADS[kind]),
        }

    bs = {0: "batch", 1: "seq"}
    return dict(
        arch="transformers LlamaModel (hidden 64, 2 layers, 4 heads, 2 KV heads (GQA), RoPE, SwiGLU, RMSNorm, vocab 1000), no KV cache",
        module=m,
        input_names=["input_ids", "attention_mask"],
        output_names=["last_hidden_state"],
        inputs=inputs,
        dynamic={"input_ids": bs, "attention_mask": bs},
        dynamic_out={"last_hidden_state": bs},
    )


def spec_clip_text():
    from transformers import CLIPTextConfig, CLIPTextModel

    torch.manual_seed(6)
    cfg = CLIPTextConfig(
        vocab_size=1000,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=16,
        hidden_act="quick_gelu",
        bos_token_id=998,
        eos_token_id=999,
        pad_token_id=999,
    )
    cfg._attn_implementation = "eager"
    m = ClipTextWrapper(CLIPTextModel(cfg).eval())
    batches = {"export": 2, 0: 1, 1: 3}
    S = 16

    def inputs(kind, rng):
        b = batches[kind]
        ids = rng.integers(1, 998, size=(b, S), dtype=np.int64)
        ids[:, 0] = 998
        for i in range(b):  # eos at varying positions, then padding with eos id
            e = int(rng.integers(3, S))
            ids[i, e:] = 999
        return {"input_ids": ids}

    return dict(
        arch="transformers CLIPTextModel (hidden 64, 2 layers, 4 heads, ffn 128, quick_gelu, 16 positions, vocab 1000)",
        module=m,
        input_names=["input_ids"],
        output_names=["last_hidden_state", "pooler_output"],
        inputs=inputs,
        dynamic={"input_ids": {0: "batch"}},
        dynamic_out={"last_hidden_state": {0: "batch"}, "pooler_output": {0: "batch"}},
    )


def spec_sd_unet():
    from diffusers import UNet2DConditionModel

    torch.manual_seed(7)
    unet = UNet2DConditionModel(**TINY_UNET_CONFIG).eval()
    rerandomise_zero_params(unet, seed=17)
    m = UNetWrapper(unet)
    shapes = {"export": (2, 6), 0: (1, 8), 1: (3, 5)}

    def inputs(kind, rng):
        b, s = shapes[kind]
        return {
            "sample": rng.standard_normal((b, 4, 16, 16)).astype(np.float32),
            "timestep": rng.integers(0, 1000, size=(b,), dtype=np.int64),
            "encoder_hidden_states": rng.standard_normal((b, s, 32)).astype(np.float32),
        }

    return dict(
        arch="diffusers UNet2DConditionModel (block_out (16,32), layers_per_block 1, CrossAttnDownBlock2D/DownBlock2D, UNetMidBlock2DCrossAttn, UpBlock2D/CrossAttnUpBlock2D, cross_attention_dim 32, attention_head_dim 8 (= 8 heads), 8 groups), sample 4x16x16",
        module=m,
        input_names=["sample", "timestep", "encoder_hidden_states"],
        output_names=["out_sample"],
        inputs=inputs,
        dynamic={
            "sample": {0: "batch"},
            "timestep": {0: "batch"},
            "encoder_hidden_states": {0: "batch", 1: "seq"},
        },
        dynamic_out={"out_sample": {0: "batch"}},
    )


def spec_sd_vae_decoder():
    from diffusers import AutoencoderKL

    torch.manual_seed(8)
    vae = AutoencoderKL(**TINY_VAE_CONFIG).eval()
    vae.encoder = None  # decoder only, keeps the module small
    rerandomise_zero_params(vae, seed=18)
    m = VaeDecoderWrapper(vae)
    batches = {"export": 2, 0: 1, 1: 3}

    def inputs(kind, rng):
        return {"latent": rng.standard_normal((batches[kind], 4, 16, 16)).astype(np.float32)}

    return dict(
        arch="diffusers AutoencoderKL decoder (post_quant_conv + Decoder; block_out (16,32), layers_per_block 1, 8 groups, mid-block attention), latent 4x16x16 -> image 3x32x32",
        module=m,
        input_names=["latent"],
        output_names=["sample"],
        inputs=inputs,
        dynamic={"latent": {0: "batch"}},
        dynamic_out={"sample": {0: "batch"}},
    )


# --------------------------------------------------------------------------
# Dynamic-shape fixtures: dynamic batch / height / width / length / past length,
# as real exports use them (plain torch modules unless noted)
# --------------------------------------------------------------------------


def image_inputs(shapes, channels=3):
    """make_inputs for a single NCHW image input; shapes: kind -> (batch, height, width)."""

    def inputs(kind, rng):
        b, h, w = shapes[kind]
        return {"input": rng.standard_normal((b, channels, h, w)).astype(np.float32)}

    return inputs


BHW = {"input": {0: "batch", 2: "height", 3: "width"}}


class SmallResNet(nn.Module):
    """ResNet stem (conv k7 s2 p3 + maxpool k3 s2 p1), BasicBlocks, one of them a stride-2
    downsample (3x3 s2 + 1x1 s2 projection), global average pool, linear."""

    def __init__(self, w=8, num_classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, w, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(w)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = BasicBlock(w, w, 1)
        self.layer2 = BasicBlock(w, 2 * w, 2)
        self.layer3 = BasicBlock(2 * w, 2 * w, 1)
        self.fc = nn.Linear(2 * w, num_classes)

    def forward(self, x):
        x = self.maxpool(F.relu(self.bn1(self.conv1(x))))
        x = self.layer3(self.layer2(self.layer1(x)))
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.fc(x)


def spec_resnet_hw():
    torch.manual_seed(21)
    m = SmallResNet(w=8, num_classes=10)
    calibrate_batchnorm(m, (8, 3, 64, 80), seed=31)
    # 60 -> 30 -> 15 -> 8: the stride-2 block sees an odd size
    shapes = {"export": (2, 56, 72), 0: (1, 64, 80), 1: (2, 48, 60)}
    return dict(
        arch="ResNet-style CNN: stem conv k7 s2 p3 + BN + ReLU, maxpool k3 s2 p1, BasicBlocks "
        "8 -> 16 (stride 2, 1x1 s2 projection) -> 16, global avg pool, linear 10; "
        "dynamic batch, height and width",
        module=m,
        input_names=["input"],
        output_names=["logits"],
        inputs=image_inputs(shapes),
        dynamic=BHW,
        dynamic_out={"logits": {0: "batch"}},
        dim_ranges={"height": (32, 1024), "width": (32, 1024)},
    )


class SqueezeExcite(nn.Module):
    def __init__(self, c, r=4):
        super().__init__()
        s = _make_divisible(c // r, 8)
        self.fc1 = nn.Conv2d(c, s, 1)
        self.fc2 = nn.Conv2d(s, c, 1)

    def forward(self, x):
        s = F.adaptive_avg_pool2d(x, 1)
        s = F.hardsigmoid(self.fc2(F.relu(self.fc1(s))))
        return x * s


class MBV3Block(nn.Module):
    """MobileNetV3 inverted residual: 1x1 expand, depthwise kxk (stride), optional SE,
    1x1 project; hardswish or ReLU."""

    def __init__(self, cin, exp, cout, k, stride, se, hs):
        super().__init__()
        act = nn.Hardswish if hs else nn.ReLU
        layers = []
        if exp != cin:
            layers += [nn.Conv2d(cin, exp, 1, bias=False), nn.BatchNorm2d(exp), act()]
        layers += [
            nn.Conv2d(exp, exp, k, stride, (k - 1) // 2, groups=exp, bias=False),
            nn.BatchNorm2d(exp),
            act(),
        ]
        if se:
            layers.append(SqueezeExcite(exp))
        layers += [nn.Conv2d(exp, cout, 1, bias=False), nn.BatchNorm2d(cout)]
        self.block = nn.Sequential(*layers)
        self.use_res = stride == 1 and cin == cout

    def forward(self, x):
        y = self.block(x)
        return x + y if self.use_res else y


class SmallMobileNetV3(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        # (cin, exp, cout, k, stride, se, hardswish) -- mobilenet_v3_small's first rows, narrowed
        cfg = [
            (16, 16, 16, 3, 2, True, False),
            (16, 48, 24, 3, 2, False, False),
            (24, 56, 24, 3, 1, False, False),
            (24, 64, 32, 5, 2, True, True),
            (32, 96, 32, 5, 1, True, True),
        ]
        self.stem = nn.Sequential(
            nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.Hardswish()
        )
        self.blocks = nn.Sequential(*[MBV3Block(*c) for c in cfg])
        self.last = nn.Sequential(
            nn.Conv2d(32, 96, 1, bias=False), nn.BatchNorm2d(96), nn.Hardswish()
        )
        self.head = nn.Sequential(nn.Linear(96, 64), nn.Hardswish(), nn.Linear(64, num_classes))

    def forward(self, x):
        x = self.last(self.blocks(self.stem(x)))
        return self.head(F.adaptive_avg_pool2d(x, 1).flatten(1))


def spec_mobilenetv3_hw():
    torch.manual_seed(22)
    m = SmallMobileNetV3(num_classes=10)
    calibrate_batchnorm(m, (8, 3, 64, 80), seed=32)
    shapes = {"export": (2, 56, 72), 0: (1, 72, 56), 1: (2, 40, 88)}
    return dict(
        arch="MobileNetV3-style (mobilenet_v3_small rows narrowed): stem conv s2 + hardswish, "
        "inverted residuals with depthwise 3x3/5x5 (stride 2 x3), squeeze-excite "
        "(avgpool, 1x1, ReLU, 1x1, hardsigmoid), hardswish, avg pool, MLP head; "
        "dynamic batch, height and width",
        module=m,
        input_names=["input"],
        output_names=["logits"],
        inputs=image_inputs(shapes),
        dynamic=BHW,
        dynamic_out={"logits": {0: "batch"}},
        dim_ranges={"height": (32, 1024), "width": (32, 1024)},
    )


class LayerNorm2d(nn.LayerNorm):
    """LayerNorm over the channels of an NCHW tensor (ConvNeXt's channels_first LN)."""

    def forward(self, x):
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class ConvNeXtBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.dwconv = nn.Conv2d(c, c, 7, padding=3, groups=c)
        self.norm = nn.LayerNorm(c, eps=1e-6)
        self.pwconv1 = nn.Linear(c, 4 * c)
        self.pwconv2 = nn.Linear(4 * c, c)
        self.gamma = nn.Parameter(torch.full((c,), 0.5))

    def forward(self, x):
        y = self.dwconv(x).permute(0, 2, 3, 1)  # channels last
        y = self.pwconv2(F.gelu(self.pwconv1(self.norm(y))))
        return x + (self.gamma * y).permute(0, 3, 1, 2)


class SmallConvNeXt(nn.Module):
    def __init__(self, dims=(16, 32), num_classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, dims[0], 4, 4), LayerNorm2d(dims[0], eps=1e-6))
        self.stage1 = ConvNeXtBlock(dims[0])
        self.down = nn.Sequential(LayerNorm2d(dims[0], eps=1e-6), nn.Conv2d(dims[0], dims[1], 2, 2))
        self.stage2 = nn.Sequential(ConvNeXtBlock(dims[1]), ConvNeXtBlock(dims[1]))
        self.norm = nn.LayerNorm(dims[1], eps=1e-6)
        self.head = nn.Linear(dims[1], num_classes)

    def forward(self, x):
        x = self.stage2(self.down(self.stage1(self.stem(x))))
        return self.head(self.norm(x.mean((2, 3))))


def spec_convnext_hw():
    torch.manual_seed(23)
    m = SmallConvNeXt()
    with torch.no_grad():  # give the LayerNorms non-trivial affine parameters
        g = torch.Generator().manual_seed(33)
        for mod in m.modules():
            if isinstance(mod, nn.LayerNorm):
                mod.weight.copy_(torch.rand(mod.weight.shape, generator=g) + 0.5)
                mod.bias.copy_(torch.randn(mod.bias.shape, generator=g) * 0.2)
    shapes = {"export": (2, 56, 72), 0: (1, 64, 80), 1: (2, 48, 40)}
    return dict(
        arch="ConvNeXt-style: patchify stem conv k4 s4 + channels-first LayerNorm (permute), "
        "blocks of depthwise 7x7 conv, channels-last LayerNorm, Linear 4x + GELU + Linear, "
        "layer scale, residual; LN + conv k2 s2 downsample 16 -> 32; mean pool, LN, linear; "
        "dynamic batch, height and width",
        module=m,
        input_names=["input"],
        output_names=["logits"],
        inputs=image_inputs(shapes),
        dynamic=BHW,
        dynamic_out={"logits": {0: "batch"}},
        dim_ranges={"height": (16, 1024), "width": (16, 1024)},
    )


def conv_bn_silu(cin, cout, k=3, s=1):
    return nn.Sequential(
        nn.Conv2d(cin, cout, k, s, k // 2, bias=False), nn.BatchNorm2d(cout), nn.SiLU()
    )


class TinyYolo(nn.Module):
    """YOLOv5-style: a backbone with outputs at strides 8/16/32, an FPN top-down path
    (1x1 lateral conv, nearest upsample x2, concat, conv), per-scale 1x1 detection heads
    decoded as in the YOLOv5 export (sigmoid, grid offsets from arange over the feature
    map's H and W, anchor sizes) and reshaped to [B, anchors*H*W, 5+classes], concatenated
    over scales."""

    def __init__(self, num_classes=3, na=3):
        super().__init__()
        self.na, self.no = na, 5 + num_classes
        self.stem = nn.Sequential(conv_bn_silu(3, 8, 3, 2), conv_bn_silu(8, 16, 3, 2))  # /4
        self.c3 = conv_bn_silu(16, 16, 3, 2)  # /8
        self.c4 = conv_bn_silu(16, 32, 3, 2)  # /16
        self.c5 = conv_bn_silu(32, 32, 3, 2)  # /32
        self.lat5 = conv_bn_silu(32, 16, 1)
        self.p4 = conv_bn_silu(32 + 16, 16, 3)
        self.lat4 = conv_bn_silu(16, 8, 1)
        self.p3 = conv_bn_silu(16 + 8, 16, 3)
        self.heads = nn.ModuleList(nn.Conv2d(c, na * self.no, 1) for c in (16, 16, 32))
        self.strides = (8, 16, 32)
        anchors = torch.tensor(
            [[10, 13, 16, 30, 33, 23], [30, 61, 62, 45, 59, 119], [116, 90, 156, 198, 373, 326]],
            dtype=torch.float32,
        ).view(3, na, 2)
        self.register_buffer("anchors", anchors)

    def forward(self, x):
        x = self.stem(x)
        f3 = self.c3(x)
        f4 = self.c4(f3)
        f5 = self.c5(f4)
        l5 = self.lat5(f5)
        p4 = self.p4(torch.cat([F.interpolate(l5, scale_factor=2.0, mode="nearest"), f4], 1))
        l4 = self.lat4(p4)
        p3 = self.p3(torch.cat([F.interpolate(l4, scale_factor=2.0, mode="nearest"), f3], 1))
        outs = []
        for i, f in enumerate((p3, p4, f5)):
            y = self.heads[i](f)
            b, _, ny, nx = y.shape
            y = y.view(b, self.na, self.no, ny, nx).permute(0, 1, 3, 4, 2).sigmoid()
            gy, gx = torch.meshgrid(
                torch.arange(ny, dtype=torch.float32),
                torch.arange(nx, dtype=torch.float32),
                indexing="ij",
            )
            grid = torch.stack((gx, gy), 2).view(1, 1, ny, nx, 2)
            anchor = self.anchors[i].view(1, self.na, 1, 1, 2)
            xy = (y[..., :2] * 2 - 0.5 + grid) * self.strides[i]
            wh = (y[..., 2:4] * 2) ** 2 * anchor
            y = torch.cat((xy, wh, y[..., 4:]), -1)
            outs.append(y.reshape(b, self.na * ny * nx, self.no))
        return torch.cat(outs, 1)


def spec_yolo_hw():
    torch.manual_seed(24)
    m = TinyYolo()
    calibrate_batchnorm(m, (4, 3, 64, 96), seed=34)
    shapes = {"export": (2, 96, 128), 0: (2, 64, 96), 1: (1, 128, 64)}

    # height and width must be multiples of 32 (upsampled stride-32 map concatenated with
    # the stride-16 one), so both are exported as 32 * a dim
    def dynamo_shapes(Dim):
        b = Dim("batch", min=1, max=64)
        h = 32 * Dim("h32", min=1, max=32)
        w = 32 * Dim("w32", min=1, max=32)
        return ({0: b, 2: h, 3: w},)

    return dict(
        arch="YOLOv5-style detector: conv+BN+SiLU backbone with features at stride 8/16/32, FPN "
        "top-down (1x1 lateral, nearest upsample x2, concat, conv), per-scale 1x1 heads "
        "(3 anchors, 3 classes) decoded with sigmoid + arange/meshgrid grid + anchors, reshaped to "
        "[B, 3*H*W, 8] and concatenated over scales; dynamic batch, height and width "
        "(multiples of 32)",
        module=m,
        input_names=["input"],
        output_names=["detections"],
        inputs=image_inputs(shapes),
        dynamic={"input": {0: "batch", 2: "height", 3: "width"}},
        dynamic_out={"detections": {0: "batch", 1: "boxes"}},
        dynamo_shapes=dynamo_shapes,
    )


class AudioFrontend(nn.Module):
    """wav2vec2's feature encoder (conv_feature_layers with group norm on the first layer)
    followed by its feature projection, narrowed to 32 channels."""

    def __init__(self, c=32, hidden=48):
        super().__init__()
        spec = [(10, 5)] + [(3, 2)] * 4 + [(2, 2)] * 2
        convs, cin = [], 1
        for k, s in spec:
            convs.append(nn.Conv1d(cin, c, k, s, bias=False))
            cin = c
        self.convs = nn.ModuleList(convs)
        self.gn = nn.GroupNorm(c, c)
        self.ln = nn.LayerNorm(c)
        self.proj = nn.Linear(c, hidden)

    def forward(self, samples):
        x = samples.unsqueeze(1)  # [B, 1, samples]
        for i, conv in enumerate(self.convs):
            x = conv(x)
            if i == 0:
                x = self.gn(x)
            x = F.gelu(x)
        x = x.transpose(1, 2)  # [B, frames, C]
        return self.proj(self.ln(x))


def spec_audio_frontend():
    torch.manual_seed(25)
    m = AudioFrontend()
    with torch.no_grad():
        g = torch.Generator().manual_seed(35)
        for mod in (m.gn, m.ln):
            mod.weight.copy_(torch.rand(mod.weight.shape, generator=g) + 0.5)
            mod.bias.copy_(torch.randn(mod.bias.shape, generator=g) * 0.2)
    shapes = {"export": (2, 2000), 0: (1, 1600), 1: (2, 2345)}

    def inputs(kind, rng):
        b, n = shapes[kind]
        return {"input_values": rng.standard_normal((b, n)).astype(np.float32)}

    return dict(
        arch="wav2vec2-style audio front end: raw samples [B, samples] -> unsqueeze -> conv1d "
        "k10 s5 + GroupNorm(32 groups) + GELU, conv1d k3 s2 x4 and k2 s2 x2 + GELU (32 channels), "
        "transpose to [B, frames, 32], LayerNorm, Linear 48; dynamic batch and sample count",
        module=m,
        input_names=["input_values"],
        output_names=["features"],
        inputs=inputs,
        dynamic={"input_values": {0: "batch", 1: "samples"}},
        dynamic_out={"features": {0: "batch", 1: "frames"}},
        dim_ranges={"samples": (400, 160000)},
    )


class BertTwoInputWrapper(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        o = self.model(input_ids=input_ids, attention_mask=attention_mask, return_dict=True)
        return o.last_hidden_state, o.pooler_output


def rename_input_dims(renames):
    """post_export hook: give the dims of some graph inputs new dim_param names
    ({input: {old name: new name}}) and drop graph.value_info (it would still use the old
    names; onnxruntime re-infers it)."""

    def hook(path):
        import onnx

        model = onnx.load(path)
        for inp in model.graph.input:
            for d in inp.type.tensor_type.shape.dim:
                if d.HasField("dim_param") and d.dim_param in renames.get(inp.name, {}):
                    d.dim_param = renames[inp.name][d.dim_param]
        del model.graph.value_info[:]
        onnx.save(model, path)

    return hook


def spec_bert_indep():
    from transformers import BertConfig, BertModel

    torch.manual_seed(26)
    cfg = tiny_bert_config(BertConfig, vocab=200, hidden=32)
    m = BertTwoInputWrapper(BertModel(cfg).eval())

    def inputs(kind, rng):
        b, s = SEQ_SHAPES[kind]
        return {
            "input_ids": token_ids(rng, b, s, cfg.vocab_size),
            "attention_mask": padding_mask(b, s, PADS[kind]),
        }

    bs = {0: "batch", 1: "seq"}
    return dict(
        arch="transformers BertModel (hidden 32, 2 layers, 4 heads, ffn 64, vocab 200), inputs "
        "input_ids + attention_mask only; dynamo export with shared Dims, then the dim_params "
        "of attention_mask renamed batch -> s33, seq -> s34 (independent symbols, equal at run "
        "time) and graph.value_info cleared (given distinct Dims, torch 2.13 keeps the mask's "
        "batch distinct but unifies its seq with input_ids')",
        module=m,
        input_names=["input_ids", "attention_mask"],
        output_names=["last_hidden_state", "pooler_output"],
        inputs=inputs,
        dynamic={"input_ids": bs, "attention_mask": bs},
        dynamic_out={"last_hidden_state": bs, "pooler_output": {0: "batch"}},
        post_export=rename_input_dims({"attention_mask": {"batch": "s33", "seq": "s34"}}),
    )


class KVDecoderLayer(nn.Module):
    def __init__(self, hidden, heads):
        super().__init__()
        self.heads, self.hd = heads, hidden // heads
        self.ln1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.o = nn.Linear(hidden, hidden)
        self.ln2 = nn.LayerNorm(hidden)
        self.fc1 = nn.Linear(hidden, 4 * hidden)
        self.fc2 = nn.Linear(4 * hidden, hidden)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class KVCacheLM(nn.Module):
    """Decoder-only LM, one step with a KV cache: pre-LN blocks, rotary positions at
    position = past length, attention over past + current masked by attention_mask
    [B, past+1] (1 = attend), GELU MLP, final LN, untied LM head."""

    def __init__(self, vocab=64, hidden=32, heads=4, layers=2):
        super().__init__()
        self.vocab, self.heads, self.hd, self.nl = vocab, heads, hidden // heads, layers
        self.embed = nn.Embedding(vocab, hidden)
        self.layers = nn.ModuleList(KVDecoderLayer(hidden, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(hidden)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)
        inv_freq = 1.0 / (10000.0 ** (torch.arange(0, self.hd, 2, dtype=torch.float32) / self.hd))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, input_ids, attention_mask, *past):
        b, s = input_ids.shape
        past_len = past[0].shape[2]
        pos = (torch.arange(s, dtype=torch.int64) + past_len).to(torch.float32)
        freqs = pos[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), -1)
        cos, sin = emb.cos()[None, None], emb.sin()[None, None]  # [1, 1, s, hd]
        bias = (1.0 - attention_mask[:, None, None, :].to(torch.float32)) * torch.finfo(
            torch.float32
        ).min
        x = self.embed(input_ids)
        presents = []
        for i, layer in enumerate(self.layers):
            h = layer.ln1(x)
            q, k, v = layer.qkv(h).view(b, s, 3, self.heads, self.hd).permute(2, 0, 3, 1, 4)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            k = torch.cat([past[2 * i], k], 2)
            v = torch.cat([past[2 * i + 1], v], 2)
            presents += [k, v]
            att = (q @ k.transpose(-1, -2)) / float(np.sqrt(self.hd)) + bias
            y = att.softmax(-1) @ v  # [b, heads, s, hd]
            x = x + layer.o(y.transpose(1, 2).reshape(b, s, self.heads * self.hd))
            x = x + layer.fc2(F.gelu(layer.fc1(layer.ln2(x))))
        return (self.lm_head(self.ln_f(x)), *presents)


def kv_names(layers):
    return [f"past_{kv}_{i}" for i in range(layers) for kv in ("key", "value")]


def greedy_decode_ort(sess, m, prompt, steps):
    """Greedy decode through onnxruntime: starts from empty past tensors [B, heads, 0, hd],
    feeds one token per step (prompt first), attention_mask all ones [B, past+1]; returns
    the tokens [B, steps] and, per step, the top-1 minus top-2 logit margin (min over batch)."""
    b = prompt.shape[0]
    past = {n: np.zeros((b, m.heads, 0, m.hd), dtype=np.float32) for n in kv_names(m.nl)}
    ids, toks, margins = prompt, [], []
    out_names = [o.name for o in sess.get_outputs()]
    for _ in range(steps):
        plen = next(iter(past.values())).shape[2]
        feeds = {"input_ids": ids, "attention_mask": np.ones((b, plen + 1), dtype=np.int64)}
        feeds.update(past)
        outs = dict(zip(out_names, sess.run(out_names, feeds)))
        logits = outs["logits"][:, -1, :]
        top2 = np.sort(logits, axis=-1)[:, -2:]
        margins.append(float(np.min(top2[:, 1] - top2[:, 0])))
        ids = np.argmax(logits, axis=-1).astype(np.int64)[:, None]
        toks.append(ids)
        past = {n: outs[n.replace("past_", "present_")] for n in past}
    return np.concatenate(toks, 1), margins


def greedy_decode_torch(m, prompt, steps):
    b = prompt.shape[0]
    past = [torch.zeros(b, m.heads, 0, m.hd) for _ in range(2 * m.nl)]
    ids, toks = torch.from_numpy(prompt), []
    with torch.no_grad():
        for _ in range(steps):
            mask = torch.ones(b, past[0].shape[2] + 1, dtype=torch.int64)
            logits, *past = m(ids, mask, *past)
            ids = logits[:, -1].argmax(-1, keepdim=True)
            toks.append(ids)
    return torch.cat(toks, 1).numpy()


def spec_kv_llm():
    torch.manual_seed(27)
    L, H, NH, V = 2, 32, 4, 64
    m = KVCacheLM(vocab=V, hidden=H, heads=NH, layers=L)
    with torch.no_grad():
        m.lm_head.weight.mul_(4.0)  # logits std ~1, decisive argmaxes
    hd = H // NH
    # (batch, past length); the mask of row 1 has two left-padding zeros
    shapes = {"export": (2, 5), 0: (1, 3), 1: (2, 7)}
    kvn = kv_names(L)

    def inputs(kind, rng):
        b, p = shapes[kind]
        mask = np.ones((b, p + 1), dtype=np.int64)
        if b > 1:
            mask[1, :2] = 0
        d = {"input_ids": token_ids(rng, b, 1, V), "attention_mask": mask}
        for n in kvn:
            d[n] = rng.standard_normal((b, NH, p, hd)).astype(np.float32)
        return d

    def dynamo_shapes(Dim):
        batch = Dim("batch", min=1, max=64)
        past = Dim("past", min=1, max=1024)
        # forward(input_ids, attention_mask, *past): the varargs get one nested tuple
        return ({0: batch}, {0: batch, 1: past + 1}, tuple({0: batch, 2: past} for _ in kvn))

    def extra(sess, npz, steps=10):
        prompt = np.array([[1], [37]], dtype=np.int64)
        toks, margins = greedy_decode_ort(sess, m, prompt, steps)
        ref = greedy_decode_torch(m, prompt, steps)
        if not np.array_equal(toks, ref):
            raise RuntimeError(
                f"greedy decode: onnxruntime {toks.tolist()} != torch {ref.tolist()}"
            )
        if any(len(set(row)) < 3 for row in toks.tolist()):
            raise RuntimeError(f"greedy decode is degenerate: {toks.tolist()}")
        if min(margins) < 1e-2:
            raise RuntimeError(f"greedy decode has a near tie (margin {min(margins):.3g})")
        npz["greedy:prompt"] = prompt
        npz["greedy:tokens"] = toks
        print(f"    greedy tokens {toks.tolist()}, min top-1/top-2 logit margin {min(margins):.3g}")
        return {
            "greedy": OrderedDict(
                steps=steps,
                prompt_key="greedy:prompt",
                tokens_key="greedy:tokens",
                prompt=prompt.tolist(),
                tokens=toks.tolist(),
                min_logit_margin=min(margins),
                protocol="start with past_* = zeros [B, heads, 0, head_dim] float32; each step "
                "feed input_ids [B, 1] (the prompt at step 0, then the previous step's argmax), "
                "attention_mask = ones [B, past+1] int64 and past_* = the previous step's "
                "present_*; the step's token is argmax(logits[:, -1, :]); tokens[:, t] is "
                "step t's token",
            )
        }

    return dict(
        arch="decoder-only LM step with KV cache in plain torch (2 layers, hidden 32, 4 heads, "
        "head_dim 8, vocab 64, pre-LN, rotary positions at position = past length, attention "
        "over past+current with an additive mask from attention_mask [B, past+1], GELU MLP); "
        "dynamic batch and past length, mask length exported as past+1",
        module=m,
        input_names=["input_ids", "attention_mask"] + kvn,
        output_names=["logits"] + [n.replace("past_", "present_") for n in kvn],
        inputs=inputs,
        dynamic=dict(
            {"input_ids": {0: "batch"}, "attention_mask": {0: "batch", 1: "past_plus_1"}},
            **{n: {0: "batch", 2: "past"} for n in kvn},
        ),
        dynamic_out=dict(
            {"logits": {0: "batch"}},
            **{n.replace("past_", "present_"): {0: "batch", 2: "past_plus_1"} for n in kvn},
        ),
        dynamo_shapes=dynamo_shapes,
        extra=extra,
    )


class ShapeInputsRef(nn.Module):
    """torch equivalent of the shape_inputs ONNX graph (for the eager check)."""

    def forward(self, x, sizes, shape):
        sizes = [int(v) for v in sizes]
        assert sizes[:2] == list(x.shape[:2])
        y = F.interpolate(x, size=sizes[2:], mode="nearest")
        tgt = [y.shape[i] if int(v) == 0 else int(v) for i, v in enumerate(shape)]
        return torch.relu(y.reshape(tgt))


def build_shape_inputs(path, opset):
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, ["batch", "channels", "height", "width"]
    )
    sizes = helper.make_tensor_value_info("sizes", TensorProto.INT64, [4])
    shape = helper.make_tensor_value_info("shape", TensorProto.INT64, [3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    y.type.tensor_type.shape.dim.add()
    y.type.tensor_type.shape.dim.add()
    y.type.tensor_type.shape.dim.add()  # rank 3, sizes unknown
    nodes = [
        helper.make_node(
            "Resize",
            ["x", "", "", "sizes"],
            ["resized"],
            mode="nearest",
            coordinate_transformation_mode="asymmetric",
            nearest_mode="floor",
        ),
        helper.make_node("Reshape", ["resized", "shape"], ["reshaped"]),
        helper.make_node("Relu", ["reshaped"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "shape_inputs", [x, sizes, shape], [y])
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="make_models.py"
    )
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, path)


def spec_shape_inputs():
    # nearest resize by x2 / x0.5 (exact in both onnxruntime's and torch's index arithmetic);
    # the reshape targets use 0 (copy) and -1 (infer)
    sets = {
        "export": ((1, 3, 10, 12), [1, 3, 20, 6], [0, -1, 40]),
        0: ((1, 3, 10, 12), [1, 3, 20, 6], [0, -1, 40]),  # -> [1, 9, 40]
        1: ((2, 4, 6, 16), [2, 4, 12, 8], [2, 24, -1]),  # -> [2, 24, 16]
    }

    def inputs(kind, rng):
        xs, sz, sh = sets[kind]
        return {
            "x": rng.standard_normal(xs).astype(np.float32),
            "sizes": np.array(sz, dtype=np.int64),
            "shape": np.array(sh, dtype=np.int64),
        }

    return dict(
        arch="hand-built ONNX (onnx.helper): x f32[batch,channels,height,width] -> Resize(nearest, "
        "asymmetric, floor; sizes = graph input int64[4]) -> Reshape(shape = graph input int64[3], "
        "with 0 / -1 entries) -> Relu; output rank 3 with unknown sizes; the two data sets use "
        "different sizes/shape values",
        module=ShapeInputsRef(),
        input_names=["x", "sizes", "shape"],
        output_names=["y"],
        inputs=inputs,
        onnx_builder=build_shape_inputs,
    )


# --------------------------------------------------------------------------
# control flow and data-dependent sizes (the control_flow group)
# --------------------------------------------------------------------------


def nms_reference(boxes, scores, max_per_class, iou_threshold, score_threshold, center, margin):
    """ONNX NonMaxSuppression as onnxruntime computes it (per batch and class: candidates with
    score > score_threshold by descending score, ties by index; a candidate is dropped when its
    IoU with a kept box of its class is > iou_threshold; at most max_per_class kept), in
    float64 on numpy arrays boxes [B, N, 4], scores [B, C, N]; returns int64 [K, 3] rows
    (batch, class, box).  Raises when a decision is within `margin` of a threshold (float32
    rounding could flip it in onnxruntime)."""
    b4 = boxes.astype(np.float64)
    if center:  # [x_center, y_center, width, height]
        x1, y1 = b4[..., 0] - b4[..., 2] / 2, b4[..., 1] - b4[..., 3] / 2
        x2, y2 = b4[..., 0] + b4[..., 2] / 2, b4[..., 1] + b4[..., 3] / 2
    else:  # [y1, x1, y2, x2], either corner order
        y1, y2 = np.minimum(b4[..., 0], b4[..., 2]), np.maximum(b4[..., 0], b4[..., 2])
        x1, x2 = np.minimum(b4[..., 1], b4[..., 3]), np.maximum(b4[..., 1], b4[..., 3])
    area = (x2 - x1) * (y2 - y1)
    out = []
    for bi in range(scores.shape[0]):
        for ci in range(scores.shape[1]):
            s = scores[bi, ci].astype(np.float64)
            near = np.abs(s - score_threshold) < margin
            if near.any():
                raise RuntimeError(f"NMS: a score within {margin} of the score threshold")
            cand = [i for i in np.argsort(-s, kind="stable") if s[i] > score_threshold]
            kept = []
            for i in cand:
                if len(kept) == max_per_class:
                    break
                drop = False
                for j in kept:
                    iw = min(x2[bi, i], x2[bi, j]) - max(x1[bi, i], x1[bi, j])
                    ih = min(y2[bi, i], y2[bi, j]) - max(y1[bi, i], y1[bi, j])
                    inter = max(iw, 0.0) * max(ih, 0.0)
                    if area[bi, i] <= 0 or area[bi, j] <= 0:
                        continue
                    iou = inter / (area[bi, i] + area[bi, j] - inter)
                    if abs(iou - iou_threshold) < margin:
                        raise RuntimeError(f"NMS: an IoU within {margin} of the IoU threshold")
                    if iou > iou_threshold:
                        drop = True
                        break
                if not drop:
                    kept.append(i)
            out += [(bi, ci, i) for i in kept]
    return np.array(out, dtype=np.int64).reshape(-1, 3)


class OnnxNMS(torch.autograd.Function):
    """NonMaxSuppression for the TorchScript exporter (the `symbolic` emits the ONNX op, with
    center_point_box=1 as YOLO exports use it); eager: `nms_reference`."""

    @staticmethod
    def forward(ctx, boxes, scores, max_per_class, iou_threshold, score_threshold):
        sel = nms_reference(
            boxes.numpy(), scores.numpy(), max_per_class, iou_threshold, score_threshold, 1, 2e-6
        )
        return torch.from_numpy(sel)

    @staticmethod
    def symbolic(g, boxes, scores, max_per_class, iou_threshold, score_threshold):
        def const(v, dtype):
            return g.op("Constant", value_t=torch.tensor([v], dtype=dtype))

        return g.op(
            "NonMaxSuppression",
            boxes,
            scores,
            const(max_per_class, torch.int64),
            const(iou_threshold, torch.float32),
            const(score_threshold, torch.float32),
            center_point_box_i=1,
        )


class YoloNMS(nn.Module):
    """TinyYolo followed by the NMS tail of a YOLO end-to-end export: class scores =
    objectness * class probability [B, C, N], NonMaxSuppression on the center-format boxes,
    then the selected (batch, class, box) rows gather the boxes (converted to corners) and
    scores into detections [K, 7] = (batch, x1, y1, x2, y2, score, class)."""

    def __init__(self, yolo, max_per_class=16, iou_threshold=0.45, score_threshold=0.5):
        super().__init__()
        self.yolo = yolo
        self.nms_args = (max_per_class, iou_threshold, score_threshold)

    def forward(self, images):
        pred = self.yolo(images)  # [B, N, 5 + C]: xywh, objectness, class probabilities
        boxes = pred[..., :4]
        scores = (pred[..., 5:] * pred[..., 4:5]).transpose(1, 2)  # [B, C, N]
        sel = OnnxNMS.apply(boxes, scores, *self.nms_args)  # [K, 3]
        bi, ci, ni = sel[:, 0], sel[:, 1], sel[:, 2]
        xywh = boxes[bi, ni]  # [K, 4]
        corners = torch.cat([xywh[:, :2] - xywh[:, 2:] / 2, xywh[:, :2] + xywh[:, 2:] / 2], 1)
        score = scores[bi, ci, ni]
        det = torch.cat([bi[:, None].float(), corners, score[:, None], ci[:, None].float()], 1)
        return det, sel


def spec_yolo_nms():
    torch.manual_seed(41)
    yolo = TinyYolo()
    calibrate_batchnorm(yolo, (4, 3, 64, 96), seed=42)
    m = YoloNMS(yolo)
    shapes = {"export": (2, 64, 64), 0: (1, 64, 96), 1: (2, 96, 96)}
    return dict(
        arch="YOLOv5-style detector (the yolo_hw_dynamo backbone/FPN/heads, 3 anchors, 3 classes, "
        "new weights) with an end-to-end NMS tail: scores = objectness * class probability "
        "[B, 3, N], NonMaxSuppression (center_point_box=1, 16 boxes per class, IoU 0.45, score "
        "0.5; emitted by a torch.autograd.Function symbolic), the selected (batch, class, box) "
        "rows gather boxes (xywh -> corners) and scores into detections [K, 7] = (batch, x1, y1, "
        "x2, y2, score, class); dynamic batch, height and width; K is a run-time size",
        module=m,
        input_names=["input"],
        output_names=["detections", "selected_indices"],
        inputs=image_inputs(shapes),
        dynamic={"input": {0: "batch", 2: "height", 3: "width"}},
        dynamic_out={
            "detections": {0: "num_detections"},
            "selected_indices": {0: "num_detections"},
        },
        std_unchecked=["selected_indices"],  # indices into [B, C, N]: std ~ N
    )


class IfData(nn.Module):
    """Early-exit style gate, scripted so the branch is data-dependent: a gate logit from the
    mean of the projected rows picks a one-layer path (output [n, 16]) or a two-head path whose
    results are stacked along the rows (output [2n, 16])."""

    def __init__(self, cin=8, hidden=16):
        super().__init__()
        self.proj = nn.Linear(cin, hidden)
        self.gate = nn.Linear(hidden, 1)
        self.fast = nn.Linear(hidden, hidden)
        self.slow_a = nn.Linear(hidden, hidden)
        self.slow_b = nn.Linear(hidden, hidden)

    def forward(self, x):
        h = torch.tanh(self.proj(x))
        if bool(self.gate(h).mean() > 0.0):
            y = F.relu(self.fast(h)) * 2.0
        else:
            y = torch.cat([self.slow_a(h), torch.sigmoid(self.slow_b(h)) * 3.0], 0)
        return y


def spec_if_data():
    torch.manual_seed(43)
    m = IfData()
    rows = {"export": 6, 0: 5, 1: 9}
    want = {0: True, 1: False}  # data set 0 takes the then branch, 1 the else branch

    def inputs(kind, rng):
        # redraw (with a random common offset) until the gate takes the wanted branch, away
        # from the threshold so float rounding cannot flip it
        for _ in range(1000):
            x = rng.standard_normal((rows[kind], 8)) + rng.uniform(-2.0, 2.0)
            x = x.astype(np.float32)
            with torch.no_grad():
                g = float(m.gate(torch.tanh(m.proj(torch.from_numpy(x)))).mean())
            if abs(g) > 0.05 and (kind == "export" or (g > 0) == want[kind]):
                return {"x": x}
        raise RuntimeError("if_data: no input takes the wanted branch")

    return dict(
        arch="torch.jit.script'ed gate (plain torch): h = tanh(Linear 8->16), then If(mean(Linear "
        "16->1 of h) > 0): relu(Linear 16->16)*2 [n, 16], else concat(Linear, sigmoid(Linear)*3) "
        "along rows [2n, 16]; dynamic rows n; data set 0 takes the then branch (n=5, 5 rows out), "
        "data set 1 the else branch (n=9, 18 rows out): the output row count is a run-time size",
        module=torch.jit.script(m),
        input_names=["x"],
        output_names=["y"],
        inputs=inputs,
        dynamic={"x": {0: "n"}},
        dynamic_out={"y": {0: "rows"}},
    )


class GreedyDecoder(nn.Module):
    """Greedy decoding with a GRU cell written out (torch.nn.GRUCell's equations) over a
    16-token vocabulary: from an encoder state h0 [B, 16] and BOS, each step embeds the
    previous token, updates h, takes argmax of log_softmax(Linear(h)); finished rows emit EOS;
    the loop breaks when every row has emitted EOS (or after max_steps).  Scripted, so the
    exporter writes an ONNX Loop; the per-step tokens / log-probabilities are lists
    (SequenceInsert in the loop body, ConcatFromSequence after it)."""

    def __init__(self, vocab=16, hidden=16, max_steps=24, bos=1, eos=0):
        super().__init__()
        self.emb = nn.Embedding(vocab, hidden)
        self.wi = nn.Linear(hidden, 3 * hidden)
        self.wh = nn.Linear(hidden, 3 * hidden)
        self.out = nn.Linear(hidden, vocab)
        self.max_steps, self.bos, self.eos = max_steps, bos, eos

    def forward(self, h0):
        b = h0.size(0)
        tok = torch.full([b], self.bos, dtype=torch.long)
        h = h0
        done = torch.zeros([b], dtype=torch.bool)
        toks: list[torch.Tensor] = []
        logps: list[torch.Tensor] = []
        for _ in range(self.max_steps):
            ir, iz, inn = self.wi(self.emb(tok)).chunk(3, 1)
            hr, hz, hn = self.wh(h).chunk(3, 1)
            r = torch.sigmoid(ir + hr)
            z = torch.sigmoid(iz + hz)
            h = (1 - z) * torch.tanh(inn + r * hn) + z * h
            best, nxt = F.log_softmax(self.out(h), -1).max(-1)
            nxt = torch.where(done, torch.full_like(nxt, self.eos), nxt)
            toks.append(nxt)
            logps.append(best)
            done = done | (nxt == self.eos)
            tok = nxt
            if bool(done.all()):
                break
        return torch.stack(toks, 1), torch.stack(logps, 1), h


def greedy_steps(m, h0):
    """(steps, smallest top-1 minus top-2 logit margin, number of distinct tokens) of the
    GreedyDecoder m's decode from h0."""
    b = h0.shape[0]
    tok = torch.full([b], m.bos, dtype=torch.long)
    h, done, margin, seen = h0, torch.zeros([b], dtype=torch.bool), float("inf"), set()
    with torch.no_grad():
        for step in range(1, m.max_steps + 1):
            ir, iz, inn = m.wi(m.emb(tok)).chunk(3, 1)
            hr, hz, hn = m.wh(h).chunk(3, 1)
            r, z = torch.sigmoid(ir + hr), torch.sigmoid(iz + hz)
            h = (1 - z) * torch.tanh(inn + r * hn) + z * h
            logits = m.out(h)
            top2 = logits.topk(2, -1).values
            margin = min(margin, float((top2[~done, 0] - top2[~done, 1]).min()))
            nxt = torch.where(done, torch.full_like(tok, m.eos), logits.argmax(-1))
            done = done | (nxt == m.eos)
            tok = nxt
            seen.update(nxt.tolist())
            if bool(done.all()):
                return step, margin, len(seen)
    return m.max_steps, margin, len(seen)


def spec_loop_decode():
    torch.manual_seed(44)
    m = GreedyDecoder()
    with torch.no_grad():  # decisive argmaxes, varied tokens
        m.wi.weight.mul_(3.0)
        m.wh.weight.mul_(3.0)
        m.out.weight.mul_(4.0)
        m.out.bias[m.eos] += 1.0  # most decodes stop before max_steps
    batch = {"export": 2, 0: 1, 1: 3}
    steps = {"export": (1, 24), 0: (4, 7), 1: (10, 18)}  # wanted iteration counts

    def inputs(kind, rng):
        lo, hi = steps[kind]
        for _ in range(2000):
            h0 = rng.standard_normal((batch[kind], 16)).astype(np.float32)
            n, margin, distinct = greedy_steps(m, torch.from_numpy(h0))
            if lo <= n <= hi and margin > 0.01 and distinct >= min(n, 3):
                return {"h0": h0}
        raise RuntimeError(f"loop_decode: no h0 decodes in {lo}..{hi} steps")

    return dict(
        arch="torch.jit.script'ed greedy decoder (plain torch): GRU cell written out (hidden 16, "
        "vocab 16, BOS 1, EOS 0), per step argmax of log_softmax, finished rows forced to EOS, "
        "break when all rows are done, at most 24 steps; exported as an ONNX Loop with a "
        "data-dependent condition (If inside the body) and list-append loop-carried sequences "
        "(SequenceInsert / ConcatFromSequence); dynamic batch; data set 0 (batch 1) and 1 (batch "
        "3) run different numbers of iterations: the steps dim of tokens / logprobs is a run-time "
        "size",
        module=torch.jit.script(m),
        input_names=["h0"],
        output_names=["tokens", "logprobs", "h"],
        inputs=inputs,
        dynamic={"h0": {0: "batch"}},
        dynamic_out={
            "tokens": {0: "batch", 1: "steps"},
            "logprobs": {0: "batch", 1: "steps"},
            "h": {0: "batch"},
        },
    )


class ScanCell(nn.Module):
    """One step of a GRU layer (torch.nn.GRUCell's equations) with an output projection:
    (h [B, 16], x_t [B, 8]) -> (h_next, y_t = Linear(h_next) [B, 8])."""

    def __init__(self, cin=8, hidden=16, cout=8):
        super().__init__()
        self.wi = nn.Linear(cin, 3 * hidden)
        self.wh = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, cout)

    def forward(self, h, x_t):
        ir, iz, inn = self.wi(x_t).chunk(3, 1)
        hr, hz, hn = self.wh(h).chunk(3, 1)
        r, z = torch.sigmoid(ir + hr), torch.sigmoid(iz + hz)
        h = (1 - z) * torch.tanh(inn + r * hn) + z * h
        return h, self.proj(h)


class ScanRNNRef(nn.Module):
    """torch equivalent of the scan_rnn graph: a bidirectional ScanCell recurrence over
    x [B, T, 8] from h0 [B, 16]; y [B, T, 16] = (forward y_t, backward y_t) at every t,
    h_n [B, 32] = (last forward h, last backward h)."""

    def __init__(self):
        super().__init__()
        self.fwd, self.bwd = ScanCell(), ScanCell()

    def forward(self, x, h0):
        hf, hb, yf, yb = h0, h0, [], []
        for t in range(x.shape[1]):
            hf, y = self.fwd(hf, x[:, t])
            yf.append(y)
        for t in reversed(range(x.shape[1])):
            hb, y = self.bwd(hb, x[:, t])
            yb.insert(0, y)
        return torch.cat([torch.stack(yf, 1), torch.stack(yb, 1)], -1), torch.cat([hf, hb], 1)


def build_scan_rnn(m):
    """onnx_builder for scan_rnn: each ScanCell is exported with the TorchScript exporter and its
    graph becomes the body of an ONNX Scan (its weights hoisted into the main graph, so the body
    reads them from the outer scope); the backward Scan reverses the scan input and output
    directions.  Scan length = x's dim 1 (dim_param "seq")."""

    def build(path, opset):
        import tempfile

        import onnx
        from onnx import TensorProto, helper

        inits, scans = [], []
        for tag, cell in (("fwd", m.fwd), ("bwd", m.bwd)):
            with tempfile.TemporaryDirectory() as tmp:
                p = os.path.join(tmp, "cell.onnx")
                torch.onnx.export(
                    cell,
                    (torch.zeros(2, 16), torch.zeros(2, 8)),
                    p,
                    dynamo=False,
                    opset_version=opset,
                    input_names=["h", "x_t"],
                    output_names=["h_next", "y_t"],
                    dynamic_axes={n: {0: "batch"} for n in ("h", "x_t", "h_next", "y_t")},
                )
                cell_model = onnx.load(p)
            body = cell_model.graph
            rename = {i.name: f"{tag}/{i.name}" for i in body.initializer}
            io = {"h", "x_t", "h_next", "y_t"}  # the body's inputs and outputs keep their names
            for n in body.node:  # prefix the others: the two bodies read distinct weights
                n.name = f"{tag}/{n.name}"
                n.input[:] = [rename.get(x, x if x in io else f"{tag}/{x}") for x in n.input]
                n.output[:] = [x if x in io else f"{tag}/{x}" for x in n.output]
            for t in body.initializer:
                t.name = rename[t.name]
            inits += list(body.initializer)
            del body.initializer[:]
            body.name = f"{tag}_cell"
            rev = 1 if tag == "bwd" else 0
            scans.append(
                helper.make_node(
                    "Scan",
                    ["h0", "x"],
                    [f"h_{tag}", f"y_{tag}"],
                    name=f"scan_{tag}",
                    body=body,
                    num_scan_inputs=1,
                    scan_input_axes=[1],
                    scan_input_directions=[rev],
                    scan_output_axes=[1],
                    scan_output_directions=[rev],
                )
            )
        nodes = scans + [
            helper.make_node("Concat", ["y_fwd", "y_bwd"], ["y"], axis=-1),
            helper.make_node("Concat", ["h_fwd", "h_bwd"], ["h_n"], axis=1),
        ]
        f32 = TensorProto.FLOAT
        graph = helper.make_graph(
            nodes,
            "scan_rnn",
            [
                helper.make_tensor_value_info("x", f32, ["batch", "seq", 8]),
                helper.make_tensor_value_info("h0", f32, ["batch", 16]),
            ],
            [
                helper.make_tensor_value_info("y", f32, ["batch", "seq", 16]),
                helper.make_tensor_value_info("h_n", f32, ["batch", 32]),
            ],
            initializer=inits,
        )
        model = helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="make_models.py"
        )
        model.ir_version = 8
        onnx.checker.check_model(model, full_check=True)
        onnx.save(model, path)

    return build


def spec_scan_rnn():
    torch.manual_seed(45)
    m = ScanRNNRef()
    with torch.no_grad():
        for c in (m.fwd, m.bwd):
            c.wh.weight.mul_(2.0)
            c.proj.weight.mul_(2.0)
    shapes = {"export": (2, 5), 0: (2, 5), 1: (3, 12)}  # (batch, scan length)

    def inputs(kind, rng):
        b, t = shapes[kind]
        return {
            "x": rng.standard_normal((b, t, 8)).astype(np.float32),
            "h0": (0.5 * rng.standard_normal((b, 16))).astype(np.float32),
        }

    return dict(
        arch="hand-built ONNX (onnx.helper) around TorchScript-exported parts: a bidirectional GRU "
        "layer (hidden 16, GRUCell equations written out, per-step Linear 16->8) as two ONNX Scans "
        "whose bodies are exported ScanCell graphs (weights hoisted into the main graph, read from "
        "the outer scope); the backward Scan has scan_input/output_directions = 1; x [batch, seq, "
        "8] scanned along axis 1, h0 [batch, 16]; y [batch, seq, 16], h_n [batch, 32]; scan "
        "length 5 and 12 in the two data sets; reference: ScanRNNRef (torch loop)",
        module=m,
        input_names=["x", "h0"],
        output_names=["y", "h_n"],
        inputs=inputs,
        onnx_builder=build_scan_rnn(m),
    )


class TinyDetBackbone(nn.Module):
    """Backbone for torchvision's RetinaNet: conv+ReLU stages at stride 8 and 16, returned as
    torchvision's OrderedDict of feature maps with an `out_channels` attribute."""

    def __init__(self, c=16):
        super().__init__()
        self.out_channels = c
        self.stem = nn.Sequential(
            nn.Conv2d(3, c, 3, 2, 1),
            nn.ReLU(),
            nn.Conv2d(c, c, 3, 2, 1),
            nn.ReLU(),
            nn.Conv2d(c, c, 3, 2, 1),
            nn.ReLU(),
        )
        self.down = nn.Sequential(nn.Conv2d(c, c, 3, 2, 1), nn.ReLU())

    def forward(self, x):
        f3 = self.stem(x)
        return OrderedDict([("0", f3), ("1", self.down(f3))])


class DetectorOutputs(nn.Module):
    """image [1, 3, H, W] -> torchvision detector -> (boxes [K, 4], scores [K], labels [K])."""

    def __init__(self, det):
        super().__init__()
        self.det = det

    def forward(self, image):
        out = self.det([image[0]])[0]
        return out["boxes"], out["scores"], out["labels"]


def spec_detector():
    # needs torchvision: run with /work/venv-tv/bin/python (see the module docstring)
    from torchvision.models.detection import RetinaNet
    from torchvision.models.detection.anchor_utils import AnchorGenerator

    torch.manual_seed(46)
    anchors = AnchorGenerator(sizes=((16, 24), (32, 48)), aspect_ratios=((0.5, 1.0, 2.0),) * 2)
    det = RetinaNet(
        TinyDetBackbone(),
        num_classes=4,
        min_size=64,
        max_size=128,
        anchor_generator=anchors,
        score_thresh=0.4,
        nms_thresh=0.5,
        detections_per_img=50,
        topk_candidates=40,
    )
    with torch.no_grad():
        # torchvision initialises the head convs with std 0.01 (features vanish at random
        # weights): He-initialise them, spread the class logits, keep box deltas small
        for mod in det.head.modules():
            if isinstance(mod, nn.Conv2d):
                nn.init.kaiming_normal_(mod.weight)
        det.head.regression_head.bbox_reg.weight.mul_(0.1)
        det.head.classification_head.cls_logits.weight.mul_(20.0)
        det.head.classification_head.cls_logits.bias.fill_(-3.0)
    shapes = {"export": (64, 80), 0: (64, 80), 1: (96, 72)}

    def inputs(kind, rng):
        h, w = shapes[kind]
        return {"image": rng.random((1, 3, h, w), dtype=np.float32)}

    return dict(
        arch="torchvision RetinaNet (weights=None, weights_backbone=None) with its transform and "
        "post-processing: a tiny conv backbone (16 channels, strides 8/16), RetinaNetHead (4 "
        "classes, 6 anchors per location), GeneralizedRCNNTransform (normalise, resize to "
        "min_size 64 / max_size 128), per-level score threshold 0.4 (NonZero), top-40 candidates "
        "(TopK), box decoding, batched NMS IoU 0.5 (NonMaxSuppression inside an If), at most 50 "
        "detections, boxes rescaled to the input size; image [1, 3, height, width] with dynamic "
        "height/width; the detection count is a run-time size",
        module=DetectorOutputs(det),
        input_names=["image"],
        output_names=["boxes", "scores", "labels"],
        inputs=inputs,
        dynamic={"image": {2: "height", 3: "width"}},
        dynamic_out={n: {0: "detections"} for n in ("boxes", "scores", "labels")},
        std_unchecked=["scores"],  # probabilities above the score threshold: std < 0.15
    )


# (base name, spec builder, [(exporter, opset, fixture name[, options])])
MODELS = [
    (
        "resnet18",
        spec_resnet18,
        [
            ("torchscript", TS_OPSET, "resnet18_ts"),
            ("dynamo", DYNAMO_OPSET, "resnet18_dynamo"),
            # TrainingMode.PRESERVE on an eval-mode model skips the exporter's
            # Conv+BatchNorm fusion, so this one keeps BatchNormalization nodes
            ("torchscript", TS_OPSET, "resnet18_ts_bn", {"keep_batchnorm": True}),
        ],
    ),
    (
        "mobilenetv2",
        spec_mobilenetv2,
        [
            ("torchscript", TS_OPSET, "mobilenetv2_ts"),
            ("dynamo", DYNAMO_OPSET, "mobilenetv2_dynamo"),
        ],
    ),
    (
        "bert",
        spec_bert,
        [
            ("torchscript", TS_OPSET, "bert_ts"),
            ("torchscript", 14, "bert_ts_opset14"),
            ("dynamo", DYNAMO_OPSET, "bert_dynamo"),
        ],
    ),
    (
        "gpt2",
        spec_gpt2,
        [("torchscript", TS_OPSET, "gpt2_ts"), ("dynamo", DYNAMO_OPSET, "gpt2_dynamo")],
    ),
    (
        "llama",
        spec_llama,
        [("torchscript", TS_OPSET, "llama_ts"), ("dynamo", DYNAMO_OPSET, "llama_dynamo")],
    ),
    (
        "clip_text",
        spec_clip_text,
        [("torchscript", TS_OPSET, "clip_text_ts"), ("dynamo", DYNAMO_OPSET, "clip_text_dynamo")],
    ),
    # the dynamo exporter stores a stack trace etc. in every node's metadata_props (~40% of
    # the file for the UNet); it is dropped for these two to stay within the size budget
    (
        "sd_unet",
        spec_sd_unet,
        [
            ("torchscript", TS_OPSET, "sd_unet_tiny"),
            ("dynamo", DYNAMO_OPSET, "sd_unet_tiny_dynamo", {"strip_node_metadata": True}),
        ],
    ),
    (
        "sd_vae_decoder",
        spec_sd_vae_decoder,
        [
            ("torchscript", TS_OPSET, "sd_vae_decoder_tiny"),
            ("dynamo", DYNAMO_OPSET, "sd_vae_decoder_tiny_dynamo", {"strip_node_metadata": True}),
        ],
    ),
    # dynamic-shape fixtures (dynamic height/width/length/past, derived dims, independent
    # symbols, shape-valued inputs); node metadata is stripped to save space
    ("resnet_hw", spec_resnet_hw, [("dynamo", DYNAMO_OPSET, "resnet_hw_dynamo", STRIP)]),
    (
        "mobilenetv3_hw",
        spec_mobilenetv3_hw,
        [("dynamo", DYNAMO_OPSET, "mobilenetv3_hw_dynamo", STRIP)],
    ),
    ("convnext_hw", spec_convnext_hw, [("dynamo", DYNAMO_OPSET, "convnext_hw_dynamo", STRIP)]),
    ("yolo_hw", spec_yolo_hw, [("dynamo", DYNAMO_OPSET, "yolo_hw_dynamo", STRIP)]),
    (
        "audio_frontend",
        spec_audio_frontend,
        [("dynamo", DYNAMO_OPSET, "audio_frontend_dynamo", STRIP)],
    ),
    ("bert_indep", spec_bert_indep, [("dynamo", DYNAMO_OPSET, "bert_indep_dynamo", STRIP)]),
    ("kv_llm", spec_kv_llm, [("dynamo", DYNAMO_OPSET, "kv_llm_dynamo", STRIP)]),
    ("shape_inputs", spec_shape_inputs, [("onnx.helper", DYNAMO_OPSET, "shape_inputs")]),
    # control flow and data-dependent sizes (If, Loop, Scan, NonZero / TopK / NonMaxSuppression)
    ("detector", spec_detector, [("torchscript", TS_OPSET, "detector_ts")]),
    ("yolo_nms", spec_yolo_nms, [("torchscript", TS_OPSET, "yolo_nms")]),
    ("if_data", spec_if_data, [("torchscript", TS_OPSET, "if_data")]),
    ("loop_decode", spec_loop_decode, [("torchscript", TS_OPSET, "loop_decode")]),
    ("scan_rnn", spec_scan_rnn, [("onnx.helper", TS_OPSET, "scan_rnn")]),
]
# packages a base needs beyond the fixture venv's; without them its fixtures are kept as they are
REQUIRES = {"detector": ["torchvision"]}
# named groups for --only
GROUPS = {
    "dynamic_shapes": [
        "resnet_hw_dynamo",
        "mobilenetv3_hw_dynamo",
        "convnext_hw_dynamo",
        "yolo_hw_dynamo",
        "audio_frontend_dynamo",
        "bert_indep_dynamo",
        "kv_llm_dynamo",
        "shape_inputs",
    ],
    "control_flow": ["detector_ts", "yolo_nms", "if_data", "loop_decode", "scan_rnn"],
}


# --------------------------------------------------------------------------
# Export / check machinery
# --------------------------------------------------------------------------


def to_torch(arrs, names):
    return tuple(torch.from_numpy(np.ascontiguousarray(arrs[n])) for n in names)


def export(spec, exporter, opset, path, example, options):
    m = spec["module"]
    args = to_torch(example, spec["input_names"])
    if exporter == "onnx.helper":  # hand-built graph, no torch export
        spec["onnx_builder"](path, opset)
    elif exporter == "torchscript":
        dyn = dict(spec["dynamic"])
        dyn.update(spec["dynamic_out"])
        training = (
            torch.onnx.TrainingMode.PRESERVE
            if options.get("keep_batchnorm")
            else torch.onnx.TrainingMode.EVAL
        )
        torch.onnx.export(
            m,
            args,
            path,
            dynamo=False,
            opset_version=opset,
            input_names=spec["input_names"],
            output_names=spec["output_names"],
            dynamic_axes=dyn,
            do_constant_folding=True,
            training=training,
        )
    else:
        from torch.export import Dim

        dims = {}
        ranges = spec.get("dim_ranges", {})

        def dim(name):
            if name not in dims:
                lo, hi = ranges.get(name, (1, 64))
                dims[name] = Dim(name, min=lo, max=hi)
            return dims[name]

        if "dynamo_shapes" in spec:  # derived dims (32 * h, past + 1) etc.
            dshapes = spec["dynamo_shapes"](Dim)
        else:
            dshapes = tuple(
                {ax: dim(nm) for ax, nm in spec["dynamic"].get(n, {}).items()} or None
                for n in spec["input_names"]
            )
        prog = torch.onnx.export(
            m,
            args,
            dynamo=True,
            opset_version=opset,
            input_names=spec["input_names"],
            output_names=spec["output_names"],
            dynamic_shapes=dshapes,
            external_data=False,
            optimize=True,
            verbose=False,
        )
        prog.save(path, external_data=False)
    if options.get("strip_node_metadata"):
        import onnx

        model = onnx.load(path)
        for n in walk_nodes(model.graph):
            del n.metadata_props[:]
            n.doc_string = ""
        onnx.save(model, path)
    if "post_export" in spec:
        spec["post_export"](path)


def walk_nodes(graph):
    for n in graph.node:
        yield n
        for a in n.attribute:
            if a.g is not None and a.g.node:
                yield from walk_nodes(a.g)
            for g in a.graphs:
                yield from walk_nodes(g)


def op_types(model):
    ops = set()
    count = 0
    for n in walk_nodes(model.graph):
        count += 1
        ops.add(n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}::{n.op_type}")
    for f in model.functions:
        for n in f.node:
            ops.add(n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}::{n.op_type}")
    return count, sorted(ops)


def dims_of(value_info):
    t = value_info.type.tensor_type
    out = []
    for d in t.shape.dim:
        if d.HasField("dim_param"):
            out.append(d.dim_param)
        elif d.HasField("dim_value"):
            out.append(d.dim_value)
        else:
            out.append(None)
    return out


def make_fixture(name, exporter, opset, spec, out_dir, rng_seed, options):
    import onnx
    import onnxruntime as ort

    onnx_path = os.path.join(out_dir, name + ".onnx")
    rng = np.random.default_rng(rng_seed)
    example = spec["inputs"]("export", np.random.default_rng(rng_seed + 1000))
    t0 = time.time()
    export(spec, exporter, opset, onnx_path, example, options)
    model = onnx.load(onnx_path)
    onnx.checker.check_model(model)
    if model.graph.initializer and any(i.data_location == 1 for i in model.graph.initializer):
        raise RuntimeError("model has external data")

    graph_inputs = [i.name for i in model.graph.input]
    graph_outputs = [o.name for o in model.graph.output]
    in_dims = {i.name: dims_of(i) for i in model.graph.input}
    out_dims = {o.name: dims_of(o) for o in model.graph.output}
    dynamic = any(isinstance(d, str) for dl in in_dims.values() for d in dl)
    real_opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)

    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(onnx_path, so, providers=["CPUExecutionProvider"])

    npz = OrderedDict()
    datasets = []
    for k in [0, 1] if dynamic else [0]:
        feeds_all = spec["inputs"](k, rng)
        feeds = {n: feeds_all[n] for n in graph_inputs}
        dropped = sorted(set(feeds_all) - set(graph_inputs))
        ort_out = sess.run(graph_outputs, feeds)
        with torch.no_grad():
            eager = spec["module"](*to_torch(feeds_all, spec["input_names"]))
        if isinstance(eager, torch.Tensor):
            eager = (eager,)
        eager = [e.detach().numpy() for e in eager]
        bindings = {}
        for n in graph_inputs:
            for ax, d in enumerate(in_dims[n]):
                if isinstance(d, str):
                    v = int(feeds[n].shape[ax])
                    if bindings.setdefault(d, v) != v:
                        raise RuntimeError(f"inconsistent binding for {d}")
                elif isinstance(d, int) and d != feeds[n].shape[ax]:
                    raise RuntimeError(f"static dim mismatch {n}[{ax}]")
        ds = {"bindings": bindings, "inputs": OrderedDict(), "outputs": OrderedDict()}
        if dropped:
            ds["unused_inputs_not_in_graph"] = dropped
        for n in graph_inputs:
            npz[f"in{k}:{n}"] = feeds[n]
            ds["inputs"][n] = {"dtype": str(feeds[n].dtype), "shape": list(feeds[n].shape)}
        for j, (n, o) in enumerate(zip(graph_outputs, ort_out)):
            e = eager[spec["output_names"].index(n)] if n in spec["output_names"] else eager[j]
            if o.shape != e.shape:
                raise RuntimeError(f"{n}: ORT shape {o.shape} != eager {e.shape}")
            if not np.all(np.isfinite(o)):
                raise RuntimeError(f"{n}: non-finite ORT output")
            diff = float(np.max(np.abs(o.astype(np.float64) - e.astype(np.float64))))
            scale = max(float(np.max(np.abs(e))), 1.0)
            std = float(np.std(o.astype(np.float64)))
            print(
                f"    [{name}] set {k} {n}: shape {list(o.shape)} std {std:.4g} "
                f"max|ort-eager| {diff:.3g} (rel {diff / scale:.3g})"
            )
            if diff / scale > REL_TOL:
                raise RuntimeError(f"{n}: ORT vs eager disagree, max abs diff {diff:.3g}")
            if n not in spec.get("std_unchecked", ()) and not STD_RANGE[0] <= std <= STD_RANGE[1]:
                raise RuntimeError(f"{n}: degenerate output std {std:.3g}")
            npz[f"out{k}:{n}"] = o
            ds["outputs"][n] = {
                "dtype": str(o.dtype),
                "shape": list(o.shape),
                "std": std,
                "max_abs_diff_vs_torch": diff,
            }
        datasets.append(ds)
    extra = spec["extra"](sess, npz) if "extra" in spec else {}
    npz_path = os.path.join(out_dir, name + ".npz")
    np.savez(npz_path, **npz)
    nodes, ops = op_types(model)
    entry = OrderedDict(
        name=name,
        file=name + ".onnx",
        reference=name + ".npz",
        source=spec["arch"],
        exporter=exporter,
        export_options=options,
        opset=real_opset,
        opset_imports={(o.domain or "ai.onnx"): o.version for o in model.opset_import},
        input_names=graph_inputs,
        output_names=graph_outputs,
        input_dims=in_dims,
        output_dims=out_dims,
        dynamic_dims={
            n: {str(ax): d for ax, d in enumerate(dl) if isinstance(d, str)}
            for n, dl in {**in_dims, **out_dims}.items()
            if any(isinstance(d, str) for d in dl)
        },
        bindings=[d["bindings"] for d in datasets],
        datasets=datasets,
        output_std={n: [d["outputs"][n]["std"] for d in datasets] for n in graph_outputs},
        num_nodes=nodes,
        num_initializers=len(model.graph.initializer),
        num_functions=len(model.functions),
        op_types=ops,
        onnx_bytes=os.path.getsize(onnx_path),
        npz_bytes=os.path.getsize(npz_path),
    )
    entry.update(extra)
    print(
        f"  {name}: {nodes} nodes, {len(ops)} op types, "
        f"{entry['onnx_bytes'] / 1024:.0f} KB onnx + {entry['npz_bytes'] / 1024:.0f} KB npz, "
        f"{time.time() - t0:.1f}s"
    )
    return entry


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=HERE, help="output directory (default: tests/models)")
    ap.add_argument(
        "--only",
        nargs="*",
        help="only these fixtures (fixture names, base names such as kv_llm, or a group: "
        f"{', '.join(GROUPS)}); their entries replace those of the same name in an existing "
        "manifest.json, the others are kept",
    )
    args = ap.parse_args()
    if args.only:
        args.only = [n for o in args.only for n in GROUPS.get(o, [o])]
    os.makedirs(args.out, exist_ok=True)

    import importlib
    import importlib.util

    import onnx
    import onnxruntime

    versions = {"torch": torch.__version__}
    # transformers / diffusers are not in the torchvision venv (detector_ts)
    for mod in ("transformers", "diffusers", "torchvision"):
        if importlib.util.find_spec(mod) is not None:
            versions[mod] = importlib.import_module(mod).__version__
    versions.update(
        onnx=onnx.__version__, onnxruntime=onnxruntime.__version__, numpy=np.__version__
    )
    try:
        import onnxscript

        versions["onnxscript"] = onnxscript.__version__
    except Exception:
        pass
    print("versions:", versions)

    fixtures, skipped, kept = [], OrderedDict(), set()
    # data seed of a fixture = 101 + its index in MODELS, so --only reproduces a full run's data
    all_names = [e[2] for _, _, exports in MODELS for e in exports]
    for base, builder, exports in MODELS:
        wanted = [
            (e + ({},))[:4]
            for e in exports
            if not args.only or e[2] in args.only or base in args.only
        ]
        if not wanted:
            continue
        print(f"== {base}")
        missing = [m for m in REQUIRES.get(base, ()) if importlib.util.find_spec(m) is None]
        if missing:  # e.g. torchvision: another interpreter makes these; keep what is there
            names = [w[2] for w in wanted]
            print(f"  not installed: {', '.join(missing)}; keeping the existing {', '.join(names)}")
            kept.update(names)
            continue
        try:
            spec = builder()
            spec["module"].eval()
        except Exception as e:
            traceback.print_exc()
            for _, _, name, _ in wanted:
                skipped[name] = f"building {base} failed: {type(e).__name__}: {e}"
            continue
        for exporter, opset, name, options in wanted:
            seed = 101 + all_names.index(name)
            try:
                fixtures.append(make_fixture(name, exporter, opset, spec, args.out, seed, options))
            except Exception as e:
                traceback.print_exc()
                msg = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
                print(f"  !! {name} FAILED: {msg}")
                skipped[name] = f"{exporter} export/check failed: {msg}"
                for ext in (".onnx", ".npz"):
                    p = os.path.join(args.out, name + ext)
                    if os.path.exists(p):
                        os.remove(p)

    manifest_path = os.path.join(args.out, "manifest.json")
    manifest_versions = versions
    if (args.only or kept) and os.path.exists(manifest_path):
        # merge: keep the entries of fixtures not regenerated now (with --only: all of them;
        # without: those whose requirements are not installed), in MODELS order
        with open(manifest_path) as f:
            old = json.load(f, object_pairs_hook=OrderedDict)
        if args.only and old.get("versions") and old["versions"] != versions:
            # other versions made the other fixtures: record this run's in its entries
            print(f"note: manifest versions {old['versions']}, this run's {versions}")
            manifest_versions = old["versions"]
            for e in fixtures:
                e["versions"] = versions
        done = {e["name"] for e in fixtures} | set(skipped)
        by_name = {
            e["name"]: e
            for e in old.get("fixtures", [])
            if e["name"] not in done and (args.only or e["name"] in kept)
        }
        by_name.update({e["name"]: e for e in fixtures})
        order = [e[2] for _, _, exports in MODELS for e in exports]
        fixtures = sorted(
            by_name.values(),
            key=lambda e: order.index(e["name"]) if e["name"] in order else len(order),
        )
        old_skipped = OrderedDict(
            (k, v) for k, v in old.get("skipped", {}).items() if k not in done
        )
        old_skipped.update(skipped)
        skipped = old_skipped
    manifest = OrderedDict(
        generator="tests/models/make_models.py",
        versions=manifest_versions,
        npz_layout="for data set k: in{k}:<input name>, out{k}:<output name>; outputs computed by onnxruntime; "
        'a fixture with a "greedy" entry also has greedy:prompt and greedy:tokens',
        fixtures=fixtures,
        skipped=skipped,
    )
    with open(manifest_path, "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")

    total = sum(
        os.path.getsize(os.path.join(args.out, p))
        for p in os.listdir(args.out)
        if os.path.isfile(os.path.join(args.out, p))
    )
    print()
    print(f"{'fixture':28} {'exporter':11} {'opset':>5} {'nodes':>6} {'KB':>7}  op types")
    for e in fixtures:
        kb = (e["onnx_bytes"] + e["npz_bytes"]) / 1024
        print(
            f"{e['name']:28} {e['exporter']:11} {e['opset']:>5} {e['num_nodes']:>6} {kb:>7.0f}  {' '.join(e['op_types'])}"
        )
    all_ops = sorted({o for e in fixtures for o in e["op_types"]})
    print(f"\nall op types ({len(all_ops)}): {' '.join(all_ops)}")
    for n, why in skipped.items():
        print(f"SKIPPED {n}: {why}")
    print(
        f"total size of {args.out}: {total / 1024 / 1024:.2f} MB (limit {MAX_TOTAL_BYTES / 1024 / 1024:.0f} MB)"
    )
    if total > MAX_TOTAL_BYTES:
        print("ERROR: fixtures exceed the size limit")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
