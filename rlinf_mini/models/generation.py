"""What both decoding paths of the reasoning rollout share (stages/reasoning_rollout.py's plain loop and
rlinf_mini/models/fast_generation.py): left padding, position ids over the real tokens, inverse-CDF sampling.
The actor's log-prob forward (stages/reasoning_train.py) uses the same position ids."""

from __future__ import annotations

import torch


def left_pad(prompt_ids: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token lists -> (input_ids [N, P], attention_mask [N, P]), padded on the left to the longest."""
    width = max(map(len, prompt_ids))
    ids = torch.full((len(prompt_ids), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompt_ids), width), dtype=torch.long)
    for i, p in enumerate(prompt_ids):
        if p:
            ids[i, width - len(p):] = torch.tensor(p)
            mask[i, width - len(p):] = 1
    return ids, mask


def position_ids_of(attention_mask: torch.Tensor) -> torch.Tensor:
    """[N, L]: 0, 1, 2, ... over the real tokens; pads (left or right) repeat a neighbour's value and are masked."""
    return (attention_mask.cumsum(dim=-1) - 1).clamp(min=0)


def sample_tokens(logits: torch.Tensor, u: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Inverse-CDF sampling: logits [N, V] (already divided by the temperature), u [N] in (0, 1) -> tokens [N].
    top_k / top_p keep the k most likely tokens / the smallest set whose probability reaches top_p (renormalized)."""
    probs = torch.softmax(logits.float(), dim=-1)  # [N, V]
    if top_k <= 0 and top_p >= 1.0:
        cdf = probs.cumsum(dim=-1)  # [N, V] in vocab order: no sort needed
        return torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(-1)).squeeze(-1).clamp(max=probs.shape[-1] - 1)
    sorted_probs, order = probs.sort(dim=-1, descending=True, stable=True)  # [N, V]
    keep = torch.ones_like(sorted_probs, dtype=torch.bool)
    if top_k > 0:
        keep[:, top_k:] = False
    if top_p < 1.0:  # drop a token when the tokens before it already reach top_p (the first always stays)
        keep &= (sorted_probs.cumsum(dim=-1) - sorted_probs) < top_p
    cdf = (sorted_probs * keep).cumsum(dim=-1)  # [N, V]
    pick = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(-1)).clamp(max=probs.shape[-1] - 1)  # [N, 1]
    return order.gather(-1, pick).squeeze(-1)
