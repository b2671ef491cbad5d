"""The measured error of each predicted figure, by device class: what every printout states beside a prediction.

A prediction without its error is not one. These are the latest measurements of the prediction
against the time it predicts, on models the cost model was not tuned on (``docs/benchmarks.md``
keeps the tables): on a CPU by ``tools/time_accuracy.py`` (each round calibrated afresh, a model's
error the median over rounds; the band is the lowest and highest model's); on a GPU by
``tools/gpu_check.py``, where one was lent, and a training plan's throughput by
``tools/plan_accuracy.py`` against published runs. A figure not measured on a device class says so.
"""

from __future__ import annotations

from typing import Optional

from .devices import DeviceSpec, is_cpu_spec

FIGURES = ("forward", "compiled forward", "training step", "prefill", "decode step", "generate's own work", "planned throughput")

MEASURED: dict[str, dict[str, tuple[float, float]]] = {
    "cpu": {"forward": (-0.34, 0.38), "compiled forward": (-0.26, 0.20), "training step": (-0.45, 0.49), "prefill": (-0.43, 0.20),
            "decode step": (-0.63, 0.53), "generate's own work": (-0.55, 0.06)},
    "gpu": {"planned throughput": (-0.12, 0.12)},
}
"""Per device class, per figure: the lowest and highest model's median error, as fractions, over the
latest runs on each machine of the class measured (on a CPU: eight runs on a 2-core AVX-512 EPYC,
the latest six with this release's timing of an activation's ops on an input just written, one
of them with each forward timed right after its own, the compiled forward in two of those and in
one of the two before, and a 2-core AVX2 one with the release before those, which priced every
product from memory and a decode step's attention at the smallest square one's time; the forward
also priced from the dispatch backend's recording in three runs, on 2026-11-29, the second's
MobileNetV2 -34%, and on 22 models outside the zoo, three runs on the AVX-512 EPYC, the latest's
worst LeViT-128S's +24%; the training step of 10 models, 4 outside the zoo, one run each in a
process of its own, DistilBERT's -45%: glibc's fresh pages of its 94 MB tensors on a VM whose host
takes freed memory back; and three runs with the model's own Python between its ops priced, on
2026-11-29: the forward -8% to +16%, the training step -16% to +18%, prefill -20% to +7%, the
decode step -19% to +3%; and five runs with the 1 x 1 grid of a model in the cache, a CPU's
widening weights at the square one's rate and the 3 x 3 grid, on 2026-11-29: the forward -13% to
+14%, the training step -15% to +14%, prefill -20% to +2%, the decode step -22% to +5%; and two
runs with transformers 5.25 on 2026-12-06, on a VM whose host work ran slower that day (Llama GQA's
decode step 1.2-2.3 ms, 0.6 the week before; 1.7-2.1 with transformers 5.24 that day): the forward -25% to
+17%, the training step -20% to +11%, prefill -43% to -5%, the decode step -56% to +4%; and four runs
later that day, with noise floors of 9% to 26% (the same forwards -28% in one round, +53% in the
next): the forward -32% to +38%, the training step -25% to +20%, prefill -38% to +20%, the decode
step -63% to -4%, and ``generate``'s own work between the model's calls, in the last two, -49% to
-41%; and one run later still, with each leaf module's time over 9 passes and 6 training steps a
round: the forward -20% to +7%, the training step -21% to -9%, prefill -24% to -14%, the decode
step -42% to -18%, ``generate``'s own work -55% to -28%; and two runs with every model's products
priced from the grid timed from memory, noise floors 3% and 17%: the forward -26% to +3%, the
training step -22% to +2%, prefill -16% to -10%, the decode step -15% to +53% (Llama GQA's,
measured at 1.2-1.7 ms those hours and 2.4 in a busier one), ``generate``'s own work -50% to -20%;
and two runs with each 1 x 1 convolution priced on the kernel torch runs for it, of 5 and 3 rounds,
noise floors 16% and 9%: the forward -9% to +17%, the training step -33% to +3%, prefill -8% to
-1%, the decode step -10% to +37%, ``generate``'s own work -48% to -21%, and 22 models outside the
zoo over 5 rounds -14% to +12%; and one run of 5 rounds with a decode step of a model that fits the
cache priced from the decode grid, noise floor 4%: the forward -17% to +5%, the training step -23% to
+28%, prefill -15% to -12%, the decode step -35% to -12%, ``generate``'s own work -50% to -31%; and
three runs of 5 rounds with a large output's fresh pages priced apart, noise floors 7%, 3% and 11%:
the forward -19% to +7%, the training step -19% to +4%, prefill -12% to -3%, the decode step -46%
to -9%, ``generate``'s own work -56% to -18%, and 22 models outside the zoo -15% to +10%; and one
run of 5 rounds after, noise floor 2%: the forward -10% to +10%, the training step -45% to +6%
(GPT-2's step 2.0-2.6 s in the zoo's process, 1.6-1.8 in one of its own), prefill -5% to -2%,
the decode step -28% to -12%, ``generate``'s own work -45% to -20%; and one run of 5 rounds with
AdamW's ops priced from memory's bandwidth where its tensors outgrow the cache and each training
step timed in a process of its own, noise floor 1%: the forward -13% to +4%, the training step -22%
to -7%, prefill -9% to -4%, the decode step -32% to -12%, ``generate``'s own work -45% to -25%; and
one run of 3 rounds with a CPU training step's pages counted by a model of glibc's heap, noise
floor 12%: the forward -10% to +4%, the training step -0% to +9%, prefill -2% and -2%, the decode
step -28% to -6%, ``generate``'s own work -50% to -25%; the training step -2% to +7% in the run
just before it, and four models outside the zoo -5% to +6% over 3 rounds of their own; and one
run of 3 rounds on 2026-12-07 with the cores other processes kept busy read, 0.01, noise floor 9%:
the forward -17% to +5%, the training step -15% to -4%, prefill -23% to +0%, the decode step -21%
to -4%, ``generate``'s own work -29% to -5%; and one run of 3 rounds later that day with the
model's Python priced between ops of many kinds, noise floor 15%: the forward -8% to +12%, the
training step -11% to -0%, prefill +9% to +17%, the decode step -23% to -4%, ``generate``'s own
work -34% to +6%, and 22 models outside the zoo -19% to +17% (noise floor 18%); the decode step of
tiny decoders of 14 families (``tools/decode_accuracy.py``) -27% to -9% in its latest run of 5
rounds, -26% to +4% in the one before (rounds spreading from -43% to +59%) and -34% to +39% in the
one before that; and two runs of 3 rounds on 2026-12-08 on a third machine, a 2-core AVX-512 BF16
EPYC: the same predictions as the run before, noise floor 5%: the forward -4% to +20%, the training
step -20% to -2%, prefill +1% to +14%, the decode step -21% to -7%, ``generate``'s own work -45% to
-17%, and 22 models outside the zoo -24% to +3% (noise floor 2%); then with 7 x 7 depthwise
convolutions on a curve of their own and narrowing weights no slower than the square one, noise
floor 4%: the forward -7% to +14%, the training step -16% to +12%, prefill -15% to +12%, the
decode step -6% to +2%, ``generate``'s own work -45% to -17%, and 22 models outside the zoo -25% to
+6% (noise floor 15%))."""

SOURCE = {"cpu": "tools/time_accuracy.py, 9 models, 3 rounds on each of a 2-core AVX2 (2026-11-27) and a 2-core AVX-512 CPU (2026-11-28), "
                 "the forward of 22 models outside them (2026-11-29, 2026-12-06, 2026-12-07, 2026-12-08), 9 models again in twenty-two runs (2026-12-06 to 2026-12-08, "
                 "the last two on a 2-core AVX-512 BF16 CPU), "
                 "and the decode steps of 14 tiny decoders (2026-12-07): docs/benchmarks.md",
          "gpu": "tools/plan_accuracy.py, Megatron-LM's 9 published H100 runs of 1.7B to 462B parameters on 48 to 6144 GPUs, 2026-11-28: docs/plan.md"}


def device_class(spec: DeviceSpec) -> str:
    return "cpu" if is_cpu_spec(spec) else "gpu"


def error_band(spec: DeviceSpec, figure: str) -> Optional[tuple[float, float]]:
    """The measured error band of ``figure`` (:data:`FIGURES`) on ``spec``'s device class (None: not measured)."""
    if figure not in FIGURES:
        raise ValueError(f"figure must be one of {FIGURES}, got {figure!r}")
    return MEASURED.get(device_class(spec), {}).get(figure)


def error_note(spec: DeviceSpec, figure: str) -> str:
    """The band in words, for a printout."""
    band = error_band(spec, figure)
    where = device_class(spec)
    if band is None:
        return f"error not yet measured on a {where.upper()} for this figure (docs/benchmarks.md)"
    calibrated = "calibrated " if spec.kernel_curves else "datasheet "
    return f"measured error {band[0]:+.0%} to {band[1]:+.0%} on a {calibrated}{where.upper()} ({SOURCE[where]})"
