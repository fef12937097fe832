from __future__ import annotations

import torch

from triage.segments import expand_segments, num_segments, segment_sum, segment_view


def test_segment_sum_partial_last_segment():
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0]])
    # L = 2: [1, 2] [3, 4] [5, pad 0] -> [3, 7, 5]
    assert num_segments(5, 2) == 3
    assert segment_view(x, 2).shape == (1, 3, 2)
    assert torch.equal(segment_sum(x, 2), torch.tensor([[3.0, 7.0, 5.0]]))
    assert torch.equal(
        expand_segments(torch.tensor([[3.0, 7.0, 5.0]]), 2, 5), torch.tensor([[3.0, 3, 7, 7, 5]])
    )


def test_segment_sum_exact_multiple_is_a_view_and_batched():
    x = torch.arange(12.0).reshape(2, 6)
    assert segment_view(x, 3).data_ptr() == x.data_ptr()
    # rows [0..5] and [6..11], L = 3 -> [0+1+2, 3+4+5], [6+7+8, 9+10+11]
    assert torch.equal(segment_sum(x, 3), torch.tensor([[3.0, 12.0], [21.0, 30.0]]))
    stacked = torch.stack((x, 2 * x))
    assert torch.equal(segment_sum(stacked, 3)[1], 2 * segment_sum(x, 3))
