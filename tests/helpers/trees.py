"""Parameter trees as flat dicts, for tests that compare or select leaves by name."""

import jax
import numpy as np


def leaves_by_path(tree) -> dict[str, np.ndarray]:
  """{'layer_0/attention/query/kernel': array, ...}: every leaf of `tree`, named by its path."""
  return {"/".join(str(getattr(k, "key", k)) for k in path): np.asarray(leaf)
          for path, leaf in jax.tree_util.tree_leaves_with_path(tree)}
