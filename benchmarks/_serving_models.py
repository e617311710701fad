"""Exports the two models of benchmarks/serving.py with a dynamic batch axis (random weights):
ResNet-50 (`input [batch, 3, 224, 224] -> logits [batch, 1000]`, torchvision's layout written out
here, so no torchvision is needed) and BERT-base (`input_ids, attention_mask [batch, seq] ->
last_hidden_state, pooler_output`). Runs under a venv with torch and transformers:

    /work/venv-fx/bin/python benchmarks/_serving_models.py OUT_DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn


class Bottleneck(nn.Module):
    def __init__(self, cin: int, width: int, stride: int) -> None:
        super().__init__()
        cout = width * 4
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        y = torch.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return torch.relu(y + (x if self.down is None else self.down(x)))


class ResNet50(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 64, 7, 2, 3, bias=False),
            nn.BatchNorm2d(64),
            nn.ReLU(),
            nn.MaxPool2d(3, 2, 1),
        )
        blocks, cin = [], 64
        for width, count, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
            for i in range(count):
                blocks.append(Bottleneck(cin, width, stride if i == 0 else 1))
                cin = width * 4
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(2048, 1000)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.blocks(self.stem(x))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(y, 1), 1))


def _randomize_bn(model: nn.Module) -> None:
    """Running statistics that are not the identity, as a trained network's are."""
    g = torch.Generator().manual_seed(0)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.1)
            m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)


def main(out: Path) -> None:
    torch.manual_seed(0)
    out.mkdir(parents=True, exist_ok=True)
    resnet = ResNet50().eval()
    _randomize_bn(resnet)
    with torch.no_grad():
        torch.onnx.export(
            resnet,
            (torch.randn(1, 3, 224, 224),),
            str(out / "serve_resnet50.onnx"),
            dynamo=False,
            opset_version=17,
            input_names=["input"],
            output_names=["logits"],
            dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}},
        )
    import transformers as tf

    cfg = tf.BertConfig()
    cfg._attn_implementation = "eager"
    bert = tf.BertModel(cfg).eval()

    class Wrap(nn.Module):
        def __init__(self, m: nn.Module) -> None:
            super().__init__()
            self.m = m

        def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> tuple:
            return tuple(self.m(input_ids=ids, attention_mask=mask, return_dict=False)[:2])

    ids = torch.randint(0, cfg.vocab_size, (1, 128))
    with torch.no_grad():
        torch.onnx.export(
            Wrap(bert),
            (ids, torch.ones_like(ids)),
            str(out / "serve_bert_base.onnx"),
            dynamo=False,
            opset_version=17,
            input_names=["input_ids", "attention_mask"],
            output_names=["last_hidden_state", "pooler_output"],
            dynamic_axes={
                "input_ids": {0: "batch", 1: "seq"},
                "attention_mask": {0: "batch", 1: "seq"},
                "last_hidden_state": {0: "batch", 1: "seq"},
                "pooler_output": {0: "batch"},
            },
        )


if __name__ == "__main__":
    main(Path(sys.argv[1]))
