"""Helpers shared by the tests that compare with transformers' PyTorch models (tests/hf/ and
tests/models/hf_parity_test.py); importing this needs torch."""

import torch


def randomised(hf_model, seed=0):
  """`hf_model` in eval mode with N(0, 0.2²) added to every parameter (HF's init leaves biases at
  0 and LayerNorm at 1/0, under which a misplaced bias would go unnoticed); tied weights stay
  tied. Returns (model, state_dict as numpy)."""
  generator = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for p in hf_model.parameters():
      p.add_(0.2 * torch.randn(p.shape, generator=generator))
  hf_model.eval()
  return hf_model, {k: v.detach().numpy() for k, v in hf_model.state_dict().items()}
