"""Flash-attention work from its tiles: checked by enumerating the kernel's loop bounds and
against flash-attn 2's head-dimension dispatch."""

import math

import pytest

from autoplan.costmodels.compute import flash_head_dim, flash_work


def _enumerated_tiles(seq_len: int, causal: bool, block: int = 128) -> int:
    """flash-attn 2's forward (csrc/flash_attn/src/flash_fwd_kernel.h): each 128-row block
    m of Q loops over key blocks up to n_block_max = ceil((m + 1) * 128 / 128) when causal,
    all of them otherwise; counted one by one."""
    blocks = math.ceil(seq_len / block)
    count = 0
    for m in range(blocks):
        n_max = min(blocks, math.ceil((m + 1) * block / block)) if causal else blocks
        count += n_max
    return count


@pytest.mark.parametrize("seq_len", [512, 1000, 2048, 8192, 65536])
@pytest.mark.parametrize("causal", [True, False])
def test_work_is_the_tiles_the_kernel_visits(seq_len, causal):
    tiles = _enumerated_tiles(seq_len, causal)
    assert flash_work(seq_len, 128, causal) == pytest.approx(tiles * 128**2 / seq_len**2)


def test_causal_saves_less_than_half_at_short_sequences():
    # 512 tokens: 4 blocks a side, 4 + 3 + 2 + 1 = 10 of 16 tiles = 0.625 (not 0.5);
    # 65,536 tokens: 512 blocks, 512 * 513 / 2 of 512^2 = 0.50098.
    assert flash_work(512, 64, True) == pytest.approx(10 / 16)
    assert flash_work(65536, 64, True) == pytest.approx(513 / 1024)


@pytest.mark.parametrize("head_dim", [32, 64, 80, 96, 120, 128, 150, 160, 192, 200, 256])
def test_head_dim_rounds_as_flash_attn_dispatches(head_dim):
    # flash_api.cpp: head_size_rounded = head_size <= 192 ? round_multiple(head_size, 32) : 256
    expected = ((head_dim + 31) // 32) * 32 if head_dim <= 192 else 256
    assert flash_head_dim(head_dim) == expected
    assert flash_work(4096, head_dim, False) == pytest.approx(expected / head_dim)
