"""The short-convolution state's roll at a speculative commit, in plain PyTorch (the oracle for
``kernels.conv_state.roll_conv_state``, same signature and bit-exact)."""

from __future__ import annotations

import torch


def roll_conv_state(conv: torch.Tensor, conv_in: torch.Tensor, rows: torch.Tensor, acc: torch.Tensor,
                    nodes: torch.Tensor) -> torch.Tensor:
    """Move each committed row's conv state past its accepted drafts, in place, for every layer.

    conv [nl, S, C, W], conv_in [nl, S, Tmax, C], rows [B] the slots, acc [B] the accepted counts, nodes
    [B, N] the accepted paths (padded). Column j of the new state is column acc[b] + j of (old state,
    the accepted drafts' conv inputs along their path); acc 0 leaves a row as it is. Each column is
    gathered straight from where it lives (one gather from the old states, one from the drafts' inputs,
    a select), so a commit moves about three conv states per row instead of all T drafts' inputs.
    Returns conv."""
    width, N = conv.shape[-1], nodes.shape[1]
    idx = rows.long()[:, None]                                                              # [B, 1]
    pos = acc.long()[:, None] + torch.arange(width, device=conv.device)                    # [B, width]
    old = conv[:, idx, :, pos.clamp(max=width - 1)]                                        # [B, width, nl, C]
    node = torch.gather(nodes.long(), 1, (pos - width).clamp(0, N - 1))                    # [B, width]
    new = conv_in[:, idx, node]                                                            # [nl, B, width, C]
    col = torch.where((pos < width)[None, :, :, None], old.permute(2, 0, 1, 3), new)      # [nl, B, width, C]
    conv[:, idx[:, 0]] = col.transpose(-1, -2)
    return conv
