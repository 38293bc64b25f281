"""Score a starter-kit submission on blind data: run by the portal, in the kit's stack.

``python score.py KIT_FOLDER MODULE MODEL`` with the blind data's secret seed
on standard input (never in a file or an argument another process could
read). It loads the submission, a TorchScript module that takes the kit's raw
inputs, and prints ``{"score": <float>}``. Whatever goes wrong is one line on
standard error, for the person who submitted: the portal shows it.

The portal runs it as the notebook's account, without a network, within a
time limit: a submission is code, if only TorchScript.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import numpy as np
import torch


def main(argv: list[str]) -> int:
    folder, module, model_path = argv
    secret = int(sys.stdin.readline())
    sys.path.insert(0, folder)
    kit = importlib.import_module(module)
    torch.set_num_threads(1)
    try:
        model = torch.jit.load(Path(model_path), map_location="cpu").eval()
    except Exception as e:  # anything torch says of a file that is not a model
        print(f"not a TorchScript model (torch.jit.save): {_line(e)}", file=sys.stderr)
        return 2

    def predict(inputs: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            out = model(torch.from_numpy(np.ascontiguousarray(inputs, dtype=np.float32)))
        if not isinstance(out, torch.Tensor) or out.ndim != 2 or out.shape[0] != len(inputs):
            shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise ValueError(f"the model must give one row of scores an input, not {shape}")
        return out.numpy()

    try:
        score = float(kit.score(predict, secret))
    except Exception as e:  # the model's own failure on the kit's inputs
        print(f"the model failed on the kit's inputs: {_line(e)}", file=sys.stderr)
        return 3
    print(json.dumps({"score": score}))
    return 0


def _line(error: Exception) -> str:
    """An error as one short line: TorchScript's span many, with its own traceback."""
    text = " ".join(str(error).split())
    return text if len(text) <= 400 else f"{text[:200]} ... {text[-200:]}"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
