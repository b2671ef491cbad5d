"""Count timm's models with both backends and fvcore: a corpus jitflops was not written against.

timm needs torchvision, which does not import beside the CPU build of torch 2.13; run this in a
scratch environment with the CUDA wheels (they run on the CPU):

    python -m venv /tmp/venv214 && /tmp/venv214/bin/pip install torch==2.14.1 torchvision==0.29.1 timm fvcore==0.1.5.post20221221
    /tmp/venv214/bin/pip install --no-deps -e . && /tmp/venv214/bin/python tools/timm_sweep.py --only pit_ti_224,cait_xxs24_224

Each model (random weights, ``pretrained=False``, its default input size, batch 1) is counted by the
default call, by the dispatch backend, by the dispatch backend in training mode with its backward,
and by fvcore. A model is clean when the default call and the dispatch backend agree, nothing is
unsupported, and the backward was counted. Results go to ``tools/timm_sweep_results.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
import warnings
from pathlib import Path
from typing import Any, Optional

RESULTS = Path(__file__).with_name("timm_sweep_results.json")


def count_model(name: str) -> dict[str, Any]:
    import timm
    import torch
    from fvcore.nn import FlopCountAnalysis as FvcoreAnalysis

    import jitflops

    result: dict[str, Any] = {"model": name}
    try:
        model = timm.create_model(name, pretrained=False).eval()
        x = torch.randn(1, *model.pretrained_cfg.get("input_size", (3, 224, 224)))
        default = jitflops.FlopCountAnalysis(model, x)
        result["default"], result["counted_by"] = default.total(), default.counted_by
        dispatch = jitflops.FlopCountAnalysis(model, x, backend="dispatch")
        result["dispatch"], result["unsupported"] = dispatch.total(), sorted(dispatch.unsupported_ops() | default.unsupported_ops())
        result["fvcore"] = FvcoreAnalysis(model, x).unsupported_ops_warnings(False).uncalled_modules_warnings(False).total()
        result["training"] = dict(jitflops.FlopCountAnalysis(model.train(), x, backend="dispatch", backward=True).by_phase())
    except Exception as error:
        result["error"] = f"{type(error).__name__}: {str(error)[:300]}"
    result["clean"] = "error" not in result and result["default"] == result["dispatch"] and not result["unsupported"] and result["training"].get("backward", 0) > 0
    return result


def main(argv: Optional[list[str]] = None) -> None:
    import timm

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated timm model names")
    parser.add_argument("--sample", type=int, help="a random sample of this many models")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    names = args.only.split(",") if args.only else timm.list_models()
    if args.sample:
        names = random.Random(args.seed).sample(names, args.sample)
    logging.disable(logging.WARNING)
    results = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for index, name in enumerate(names, 1):
            results.append(count_model(name))
            print(f"[{index}/{len(names)}] {json.dumps(results[-1])}", flush=True)
    summary = {"models": len(results), "clean": sum(r["clean"] for r in results), "errors": sum("error" in r for r in results)}
    args.output.write_text(json.dumps({"summary": summary, "results": results}, indent=1))
    print(json.dumps(summary))


if __name__ == "__main__":
    sys.exit(main())
