"""A GPU's dense peak FLOP/s in the precision its matmuls run in, for MFU (model FLOPs per token × tokens/s ÷ peak).

Datasheet figures per GPU, without sparsity. One name covers parts that differ: an "H100" is the SXM board
unless its name says PCIe or NVL (both slower), so those come first. An fp32 run is measured against the
TF32 tensor-core peak when torch lets matmuls use TF32, else against plain FP32 (an fp32 run compared with the
bf16 peak would read several times too low).
"""

from __future__ import annotations

import torch

# torch.cuda.get_device_name fragment -> (bf16 / fp16 tensor cores, TF32 tensor cores, FP32) FLOP/s, dense.
# The first fragment the name contains wins.
PEAKS: tuple[tuple[str, tuple[float, float, float]], ...] = (
    ("H100 NVL", (835e12, 418e12, 60e12)),
    ("H100 PCIe", (756e12, 378e12, 51e12)),
    ("H100", (989e12, 495e12, 67e12)),  # SXM5: "NVIDIA H100 80GB HBM3"
    ("H200", (989e12, 495e12, 67e12)),  # GH200's GPU too
    ("A100", (312e12, 156e12, 19.5e12)),
    ("L40S", (362e12, 183e12, 91.6e12)),
    ("A10G", (125e12, 62.5e12, 31.2e12)),
    ("4090", (165e12, 82.6e12, 82.6e12)),  # bf16 with fp32 accumulation, as torch runs it
)


def peak_flops(device: torch.device, precision: str = "bf16") -> float | None:
    """The dense peak of `device` for `precision` (accelerate's mixed_precision: bf16 | fp16 | no), or None
    for a device not in PEAKS (no MFU is reported then)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    peaks = next((p for fragment, p in PEAKS if fragment in name), None)
    if peaks is None:
        return None
    if precision in ("bf16", "fp16"):
        return peaks[0]
    return peaks[1] if torch.backends.cuda.matmul.allow_tf32 else peaks[2]
