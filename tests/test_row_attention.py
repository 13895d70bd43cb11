"""The row attention kernel (engine/kernels/native/attention.cpp) against SDPA, and its row exactness."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.kernels.cpu_features import has_avx2
from engine.runtime.attention import attend_rows

pytestmark = [
    pytest.mark.skipif(not has_avx2(), reason="this CPU has no AVX2, where the row attention kernel runs"),
    pytest.mark.usefixtures("kernel_built"),
]


KV, G, SLOTS = 3, 3, 67  # slots not a multiple of 8: a last block of keys reads the zero padding


def sdpa_row(q_row, k, v, visible):
    """q_row: [H, D]; visible: [S] bool -> [H, D], SDPA over the visible slots of each KV head."""
    heads, d = q_row.shape
    q = q_row.view(1, KV, heads // KV, d)
    return F.scaled_dot_product_attention(q, k[:, :, visible], v[:, :, visible]).reshape(heads, d)


@pytest.mark.parametrize("head_dim", [32, 64, 128])
def test_rows_by_length_and_by_mask_match_sdpa(head_dim):
    torch.manual_seed(head_dim)
    k, v = torch.randn(1, KV, SLOTS, head_dim), torch.randn(1, KV, SLOTS, head_dim)
    q = torch.randn(5, KV * G, head_dim)
    lengths = torch.tensor([1, 9, 40, 66, 67])
    by_length = attend_rows(q, k, v, lengths, None)
    mask = torch.rand(5, SLOTS) < 0.5
    mask[:, 0] = True
    by_mask = attend_rows(q, k, v, None, mask)
    for t in range(5):
        seen = torch.arange(SLOTS) < lengths[t]
        torch.testing.assert_close(by_length[t], sdpa_row(q[t], k, v, seen), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(by_mask[t], sdpa_row(q[t], k, v, mask[t]), atol=1e-5, rtol=1e-5)


def test_each_row_is_the_same_alone_or_among_others_and_a_masked_row_as_its_slots_packed():
    torch.manual_seed(0)
    k, v = torch.randn(1, KV, SLOTS, 64), torch.randn(1, KV, SLOTS, 64)
    q = torch.randn(16, KV * G, 64)
    lengths = torch.arange(SLOTS - 15, SLOTS + 1)
    together = attend_rows(q, k, v, lengths, None)
    for t in range(16):
        assert torch.equal(together[t], attend_rows(q[t : t + 1], k, v, lengths[t : t + 1], None)[0])
    # a tree row that skips slots 20..29 sums as a step over the same slots packed together
    visible = torch.ones(1, SLOTS, dtype=torch.bool)
    visible[0, 20:30] = False
    kept = visible[0]
    packed = attend_rows(
        q[:1], k[:, :, kept].contiguous(), v[:, :, kept].contiguous(), torch.tensor([57]), None
    )
    assert torch.equal(attend_rows(q[:1], k, v, None, visible), packed)


def test_bad_arguments_are_refused_with_a_message():
    k = v = torch.zeros(1, KV, SLOTS, 64)
    q = torch.zeros(1, KV * G, 64)
    with pytest.raises(RuntimeError, match="outside the cache"):
        attend_rows(q, k, v, torch.tensor([SLOTS + 1]), None)
    with pytest.raises(RuntimeError, match="head size"):
        attend_rows(
            torch.zeros(1, KV * G, 48),
            torch.zeros(1, KV, 8, 48),
            torch.zeros(1, KV, 8, 48),
            torch.tensor([1]),
            None,
        )
    with pytest.raises(RuntimeError, match="length or a mask"):
        attend_rows(q, k, v, None, None)
