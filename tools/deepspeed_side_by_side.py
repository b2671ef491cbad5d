"""DeepSpeed's Flops Profiler and jitflops on the same model, printed one after the other.

Needs DeepSpeed (``DS_BUILD_OPS=0 pip install deepspeed "torch==2.13.0"``: its profiler is pure
Python), so it lives here and not in the test suite. The README's DeepSpeed section shows its
output.

    python tools/deepspeed_side_by_side.py            # a small BERT (2 layers), 64 tokens
"""

from __future__ import annotations

import logging
import sys
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)
    import transformers
    from deepspeed.profiling.flops_profiler import get_model_profile as deepspeed_profile

    from jitflops import get_model_profile

    torch.manual_seed(0)
    config = transformers.BertConfig(num_hidden_layers=2, hidden_size=256, num_attention_heads=4, intermediate_size=1024)
    model = transformers.BertModel(config).eval()
    ids = torch.randint(0, config.vocab_size, (1, 64))
    for name, profile in (("DeepSpeed 0.19.8", deepspeed_profile), ("jitflops", get_model_profile)):
        print(f"======== {name} ========")
        flops, macs, params = profile(model, args=[ids], module_depth=2, top_modules=1, detailed=True, warm_up=1, as_string=False)
        print(f"returned: flops={flops} macs={macs} params={params}\n")


if __name__ == "__main__":
    main()
