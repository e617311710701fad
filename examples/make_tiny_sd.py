#!/usr/bin/env python3
"""Developer script (needs torch): build and export the tiny Stable-Diffusion-shaped pipeline that
ships in kn_runtime/sd/tiny_sd/ (`kn-sd`'s default, package data of the wheel), or with
--full-unet DIR a full SD 1.5 UNet with random weights.

Not run by CI. Everything is built from configs with fixed seeds (nothing is downloaded):

* a small CLIP byte-level BPE vocabulary trained here on a few hundred prompt words, in CLIP's
  layout (256 byte symbols, the same with ``</w>``, one entry per merge, then the start and end
  tokens, so the end token has the highest id as CLIP's pooling expects);
* a CLIP text encoder (hidden 32 = the UNet's cross_attention_dim), the UNet and the VAE decoder
  at the configurations of tests/models/make_models.py (latents 4x16x16 -> a 32x32 picture by
  default; the VAE upsamples by 2);
* exported in the folder layout of the common exporters (optimum): ``text_encoder/model.onnx``
  (int32 input_ids), ``unet/model.onnx`` + ``model.onnx_data`` (external weights),
  ``vae_decoder/model.onnx``, ``tokenizer/`` (vocab.json, merges.txt, tokenizer_config.json), the
  diffusers config.json files and ``scheduler/scheduler_config.json``.

Random weights give a random noise prediction of arbitrary scale; the UNet's and VAE's conv_out
are rescaled so that the noise prediction has unit spread (like a trained epsilon model) and the
decoded image spans the pixel range, otherwise the picture is a flat grey or saturated square.

    /work/venv-fx/bin/python examples/make_tiny_sd.py                 # -> kn_runtime/sd/tiny_sd/
    /work/venv-fx/bin/python examples/make_tiny_sd.py --full-unet /work/sd15_unet
    /work/venv-fx/bin/python examples/make_tiny_sd.py --print-token-ids  # ids for the tests
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import logging
import os
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root
from tests.models.make_models import (
    TINY_UNET_CONFIG,
    TINY_VAE_CONFIG,
    rerandomise_zero_params,
)

logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)
warnings.filterwarnings("ignore")
torch.set_num_threads(2)

ROOT = Path(__file__).resolve().parents[1]
TINY_SD = ROOT / "kn_runtime" / "sd" / "tiny_sd"  # package data, shipped in the wheel
OPSET = 17
NUM_MERGES = 400
TEXT_LENGTH = 16

# Prompt-like words for the tiny BPE vocabulary (any text would do; these make common prompts
# tokenize into few pieces).
CORPUS = """
a photograph of an astronaut riding a horse on mars highly detailed digital painting
portrait of a cat wearing a hat in the style of van gogh oil on canvas trending on artstation
beautiful landscape with mountains and a lake at sunset golden hour dramatic lighting
the city at night with neon lights rain reflections cyberpunk street cinematic
a red apple on a wooden table still life soft light sharp focus photorealistic
an old castle in the forest fog fantasy concept art matte painting epic
a small robot reading a book in a cozy library warm colors illustration
watercolor of flowers in a blue vase spring garden bright pastel
a dog running on the beach waves ocean blue sky clouds summer day
futuristic spaceship flying over a desert planet two moons science fiction
close up of an eye macro photography detailed texture bokeh
snowy village in winter with lights christmas evening quiet peaceful
a bowl of ramen noodles food photography steam delicious
the ancient temple ruins jungle overgrown adventure explorer
underwater coral reef fish colorful sunlight rays deep sea
a dragon made of fire and smoke dark background black and white
minimalist poster of a mountain simple shapes flat design vector art
a knight in shining armor holding a sword hero brave
tiny house on a hill green grass trees road path morning
portrait photo of an old man with a beard wrinkles studio light 50mm
ugly blurry low quality deformed bad anatomy watermark text
"""


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2/CLIP's printable stand-in for every byte (the vocabulary's base symbols)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs), strict=True))


def train_bpe(text: str, num_merges: int) -> tuple[list[str], list[tuple[str, str]]]:
    """CLIP-style byte-level BPE training: words as byte symbols, the last one with ``</w>``;
    repeatedly merge the most frequent adjacent pair (ties: the smaller pair)."""
    b2u = bytes_to_unicode()
    counts = collections.Counter(text.lower().split())
    words = {w: [b2u[b] for b in w.encode()] for w in counts}
    for sym in words.values():
        sym[-1] += "</w>"
    merges: list[tuple[str, str]] = []
    for _ in range(num_merges):
        pairs: collections.Counter[tuple[str, str]] = collections.Counter()
        for w, sym in words.items():
            for a, b in itertools.pairwise(sym):
                pairs[(a, b)] += counts[w]
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merges.append(best)
        for sym in words.values():
            i = 0
            while i < len(sym) - 1:
                if (sym[i], sym[i + 1]) == best:
                    sym[i : i + 2] = [sym[i] + sym[i + 1]]
                i += 1
    base = list(b2u.values())
    vocab = base + [s + "</w>" for s in base] + ["".join(m) for m in merges]
    vocab += ["<|startoftext|>", "<|endoftext|>"]
    return vocab, merges


def write_tokenizer(folder: Path) -> dict[str, int]:
    vocab, merges = train_bpe(CORPUS, NUM_MERGES)
    ids = {tok: i for i, tok in enumerate(vocab)}
    if len(ids) != len(vocab):
        raise RuntimeError("duplicate vocabulary entries")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.json").write_text(json.dumps(ids, ensure_ascii=False) + "\n", encoding="utf-8")
    lines = ["#version: 0.2"] + [f"{a} {b}" for a, b in merges]
    (folder / "merges.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    cfg = {
        "model_max_length": TEXT_LENGTH,
        "bos_token": "<|startoftext|>",
        "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
        "unk_token": "<|endoftext|>",
        "do_lower_case": True,
        "tokenizer_class": "CLIPTokenizer",
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg, indent=1) + "\n")
    return ids


class TextEncoder(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        o = self.model(input_ids=input_ids.long(), return_dict=True)
        return o.last_hidden_state, o.pooler_output


class UNet(nn.Module):
    def __init__(self, unet: nn.Module) -> None:
        super().__init__()
        self.unet = unet

    def forward(
        self, sample: torch.Tensor, timestep: torch.Tensor, ehs: torch.Tensor
    ) -> torch.Tensor:
        return self.unet(sample, timestep, ehs, return_dict=False)[0]


class VaeDecoder(nn.Module):
    def __init__(self, vae: nn.Module) -> None:
        super().__init__()
        self.vae = vae

    def forward(self, latent_sample: torch.Tensor) -> torch.Tensor:
        return self.vae.decode(latent_sample).sample


def scale_conv_out(conv: nn.Conv2d, factor: float) -> None:
    with torch.no_grad():
        conv.weight.mul_(factor)
        if conv.bias is not None:
            conv.bias.mul_(factor)


def export(
    module: nn.Module,
    args: tuple[torch.Tensor, ...],
    path: Path,
    inputs: list[str],
    outputs: list[str],
    dynamic: dict[str, dict[int, str]],
    external: bool,
) -> None:
    """TorchScript export (as optimum does), then one external data file when asked."""
    path.parent.mkdir(parents=True, exist_ok=True)
    import onnx

    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "model.onnx"
        torch.onnx.export(
            module,
            args,
            str(raw),
            dynamo=False,
            opset_version=OPSET,
            input_names=inputs,
            output_names=outputs,
            dynamic_axes=dynamic,
            do_constant_folding=True,
        )
        model = onnx.load(str(raw))  # reads any per-tensor external files of a >2 GB export
    for f in path.parent.glob(path.name + "*"):
        f.unlink()
    if external:
        onnx.save(
            model,
            str(path),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=path.name + "_data",
            size_threshold=1024,
        )
    else:
        onnx.save(model, str(path))
    onnx.checker.check_model(str(path))


def write_json(path: Path, obj: dict) -> None:
    """diffusers' `_use_default_values` is a set in disguise (its order changes run to run)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    obj = {k: v for k, v in obj.items() if k != "_use_default_values"}
    path.write_text(json.dumps(obj, indent=1) + "\n")


def build_tiny(out: Path) -> None:
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    if out.exists():
        shutil.rmtree(out)
    ids = write_tokenizer(out / "tokenizer")
    bos, eos = ids["<|startoftext|>"], ids["<|endoftext|>"]

    torch.manual_seed(6)
    cfg = CLIPTextConfig(
        vocab_size=len(ids),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=TEXT_LENGTH,
        hidden_act="quick_gelu",
        bos_token_id=bos,
        eos_token_id=eos,
        pad_token_id=eos,
    )
    cfg._attn_implementation = "eager"
    text = TextEncoder(CLIPTextModel(cfg).eval()).eval()
    ids_ex = torch.full((2, TEXT_LENGTH), eos, dtype=torch.int32)
    ids_ex[:, 0] = bos
    ids_ex[:, 1:5] = torch.arange(600, 604, dtype=torch.int32)
    seq = {0: "batch_size", 1: "sequence_length"}
    export(
        text,
        (ids_ex,),
        out / "text_encoder" / "model.onnx",
        ["input_ids"],
        ["last_hidden_state", "pooler_output"],
        {"input_ids": seq, "last_hidden_state": seq, "pooler_output": {0: "batch_size"}},
        False,
    )
    write_json(out / "text_encoder" / "config.json", cfg.to_diff_dict())

    torch.manual_seed(7)
    unet = UNet2DConditionModel(**TINY_UNET_CONFIG).eval()
    rerandomise_zero_params(unet, seed=17)
    g = torch.Generator().manual_seed(70)
    sample = torch.randn(2, 4, 16, 16, generator=g)
    ehs = torch.randn(2, TEXT_LENGTH, 32, generator=g)
    steps = torch.tensor([981, 981], dtype=torch.int64)
    with torch.no_grad():
        std = float(unet(sample, steps, ehs).sample.std())
    scale_conv_out(unet.conv_out, 1.0 / std)  # unit-spread noise prediction
    image_hw = {0: "batch_size", 2: "height", 3: "width"}
    export(
        UNet(unet),
        (sample, steps, ehs),
        out / "unet" / "model.onnx",
        ["sample", "timestep", "encoder_hidden_states"],
        ["out_sample"],
        {
            "sample": image_hw,
            "timestep": {0: "steps"},
            "encoder_hidden_states": {0: "batch_size", 1: "sequence_length"},
            "out_sample": image_hw,
        },
        True,
    )
    write_json(out / "unet" / "config.json", dict(unet.config))

    torch.manual_seed(8)
    vae = AutoencoderKL(**TINY_VAE_CONFIG).eval()
    vae.encoder = None
    rerandomise_zero_params(vae, seed=18)
    latent = torch.randn(1, 4, 16, 16, generator=g) / 0.18215 * 0.7
    with torch.no_grad():
        img = vae.decode(latent).sample
    scale_conv_out(vae.decoder.conv_out, 0.6 / float(img.std()))  # pixels spread over [-1, 1]
    export(
        VaeDecoder(vae),
        (latent,),
        out / "vae_decoder" / "model.onnx",
        ["latent_sample"],
        ["sample"],
        {"latent_sample": image_hw, "sample": image_hw},
        False,
    )
    write_json(out / "vae_decoder" / "config.json", dict(vae.config))

    write_json(
        out / "scheduler" / "scheduler_config.json",
        {
            "_class_name": "PNDMScheduler",
            "beta_start": 0.00085,
            "beta_end": 0.012,
            "beta_schedule": "scaled_linear",
            "num_train_timesteps": 1000,
            "set_alpha_to_one": False,
            "skip_prk_steps": True,
            "steps_offset": 1,
            "prediction_type": "epsilon",
        },
    )
    write_json(
        out / "model_index.json",
        {
            "_class_name": "ORTStableDiffusionPipeline",
            "note": "random weights, see make_tiny_sd.py",
        },
    )
    total = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    for f in sorted(out.rglob("*")):
        if f.is_file():
            print(f"  {f.relative_to(out)}: {f.stat().st_size / 1024:.1f} KB")
    print(f"{out}: {total / 1024 / 1024:.2f} MB, vocabulary {len(ids)} tokens")


def build_full_unet(out: Path) -> None:
    """SD 1.5's UNet configuration (860M parameters) with random weights, external data."""
    from diffusers import UNet2DConditionModel

    torch.manual_seed(15)
    unet = UNet2DConditionModel(
        sample_size=64,
        in_channels=4,
        out_channels=4,
        layers_per_block=2,
        block_out_channels=(320, 640, 1280, 1280),
        down_block_types=(
            "CrossAttnDownBlock2D",
            "CrossAttnDownBlock2D",
            "CrossAttnDownBlock2D",
            "DownBlock2D",
        ),
        up_block_types=(
            "UpBlock2D",
            "CrossAttnUpBlock2D",
            "CrossAttnUpBlock2D",
            "CrossAttnUpBlock2D",
        ),
        cross_attention_dim=768,
        attention_head_dim=8,
        norm_num_groups=32,
    ).eval()
    rerandomise_zero_params(unet, seed=16)
    n = sum(p.numel() for p in unet.parameters())
    print(f"SD 1.5 UNet: {n / 1e6:.1f}M parameters")
    g = torch.Generator().manual_seed(150)
    args = (
        torch.randn(2, 4, 64, 64, generator=g),
        torch.tensor([981, 981]),
        torch.randn(2, 77, 768, generator=g),
    )
    image_hw = {0: "batch_size", 2: "height", 3: "width"}
    export(
        UNet(unet),
        args,
        out / "unet" / "model.onnx",
        ["sample", "timestep", "encoder_hidden_states"],
        ["out_sample"],
        {
            "sample": image_hw,
            "timestep": {0: "steps"},
            "encoder_hidden_states": {0: "batch_size", 1: "sequence_length"},
            "out_sample": image_hw,
        },
        True,
    )
    write_json(out / "unet" / "config.json", dict(unet.config))
    for f in sorted((out / "unet").iterdir()):
        print(f"  {f}: {f.stat().st_size / 1e6:.1f} MB")


PROMPTS = [
    "a photograph of an astronaut riding a horse on mars",
    "A Cat's  hat, in the style of Van Gogh!!",
    "",
    "zebra 123 über-café 🙂",
]


def print_token_ids(folder: Path) -> None:
    """Reference ids from transformers' CLIPTokenizer (the tokenizers library) for the tests."""
    from transformers import CLIPTokenizer

    vocab = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
    lines = (folder / "merges.txt").read_text(encoding="utf-8").splitlines()
    merges = [tuple(m.split()) for m in lines[1:] if m]
    tok = CLIPTokenizer(vocab=vocab, merges=merges)
    for p in PROMPTS:
        print(repr(p), tok(p)["input_ids"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=TINY_SD, help="tiny pipeline folder")
    ap.add_argument(
        "--full-unet",
        type=Path,
        metavar="DIR",
        help="instead export the full SD 1.5 UNet (random weights) to DIR/unet/",
    )
    ap.add_argument(
        "--print-token-ids",
        action="store_true",
        help="print reference token ids of a few prompts for the tests",
    )
    args = ap.parse_args()
    if args.print_token_ids:
        print_token_ids(args.out / "tokenizer")
    elif args.full_unet:
        build_full_unet(args.full_unet)
    else:
        build_tiny(args.out)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
