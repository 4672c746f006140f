"""Every precision the agent trains in on a device commits fingerprints the portal's fp32 recomputation
on the CPU accepts (bench/gpu.py runs the same on CUDA: fp16 with the GradScaler and bf16)."""

import pytest
import torch

from bench.gpu import precision_measure, precisions_offered

pytestmark = [pytest.mark.swarm, pytest.mark.timeout(300), pytest.mark.usefixtures("reap_children", "torch_threads")]


def test_the_cpu_offers_fp32_and_bf16_and_never_fp16():
    assert precisions_offered(torch.device("cpu")) == ["fp32", "bf16"]


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_step_in_each_cpu_precision_recomputes_in_fp32_within_the_runs_tolerance(tmp_path, precision):
    result = precision_measure(tmp_path, device=torch.device("cpu"), precision=precision, preset="tiny", seq_length=32,
                               batch_size=4, steps=4, warmup=1, checks=2)

    assert result.skipped == 0, "no step was dropped"
    assert len(result.distances) == 2, "each rechecked step committed a fingerprint"
    assert max(result.distances) <= result.tolerance, result.distances
    if precision == "fp32":
        # The same arithmetic on the same device: only summation order may differ.
        assert max(result.distances) < 1e-4, result.distances
    else:
        assert max(result.distances) > 0, "bf16 autocast really ran (an fp32 step would recompute exactly)"
