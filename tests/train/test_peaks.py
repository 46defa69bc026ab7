"""MFU's peak: the part a GPU's name says (H100 SXM, PCIe, NVL) and the precision its matmuls run in."""

import pytest
import torch

from plmcli.train import peaks


@pytest.mark.parametrize("name,precision,tf32,want", [
    ("NVIDIA H100 80GB HBM3", "bf16", False, 989e12),  # SXM
    ("NVIDIA H100 PCIe", "bf16", False, 756e12),
    ("NVIDIA H100 NVL", "fp16", False, 835e12),
    ("NVIDIA H200", "bf16", False, 989e12),
    ("NVIDIA A100-SXM4-80GB", "no", True, 156e12),  # fp32 on TF32 tensor cores
    ("NVIDIA A100-SXM4-80GB", "no", False, 19.5e12),  # plain fp32
    ("NVIDIA H100 PCIe", "no", False, 51e12),
    ("Tesla V100-SXM2-16GB", "bf16", False, None),  # not in the table: no MFU
])
def test_the_peak_of_the_part_and_the_precision(name, precision, tf32, want, monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    # Set and restored by hand: the flag lives behind cuBLASModule's __getattr__/__setattr__, not in its __dict__,
    # so pytest ≥ 9.2's monkeypatch tries to delete it on undo (AttributeError).
    matmul, saved = torch.backends.cuda.matmul, torch.backends.cuda.matmul.allow_tf32
    matmul.allow_tf32 = tf32
    try:
        assert peaks.peak_flops(torch.device("cuda", 0), precision) == want
    finally:
        matmul.allow_tf32 = saved


def test_no_peak_off_a_gpu():
    assert peaks.peak_flops(torch.device("cpu"), "bf16") is None
