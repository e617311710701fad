"""`python -m kn_cuda_eval.cuda.device [INDEX]`: the versions of the GPU stack and whether device
INDEX can run plans (exit status 0 when it can, 1 when not)."""

from __future__ import annotations

import sys

from kn_cuda_eval.cuda.device.probe import cudnn_problem, device_count, probe, versions


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    index = int(args[0]) if args else 0
    for k, v in versions(index).items():
        print(f"{k:>20}: {v}")
    print(f"{'devices':>20}: {device_count()}")
    reason = probe(index)
    print(
        f"{'cuda:' + str(index):>20}: {'usable' if reason is None else 'no CUDA device: ' + reason}"
    )
    if reason is None:
        dnn = cudnn_problem()
        print(f"{'convolutions':>20}: {'cuDNN usable' if dnn is None else dnn}")
    return 0 if reason is None else 1


if __name__ == "__main__":
    sys.exit(main())
