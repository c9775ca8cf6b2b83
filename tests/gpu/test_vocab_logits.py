"""The logits over the vocabulary on the CPU (gpu/model.py vocab_logits): the faster kernel's order gives
x @ output.T for any number of rows, none included, and a row's logits do not move with a second row."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from gpu.model import vocab_logits  # noqa: E402


@pytest.mark.parametrize("rows", [0, 1, 2, 5])
def test_the_logits_are_x_times_the_output_transposed(rows: int):
    generator = torch.Generator().manual_seed(rows)
    output = torch.randn(3000, 64, generator=generator)
    x = torch.randn(rows, 64, generator=generator)
    logits = vocab_logits(x, output)
    assert logits.shape == (rows, 3000)
    torch.testing.assert_close(logits, F.linear(x, output), rtol=1e-5, atol=1e-4)


def test_a_row_alone_equals_itself_beside_another():
    generator = torch.Generator().manual_seed(7)
    output = torch.randn(3000, 64, generator=generator)
    x = torch.randn(2, 64, generator=generator)
    assert torch.equal(vocab_logits(x[:1], output)[0], vocab_logits(x, output)[0])
