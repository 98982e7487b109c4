"""bertfam_jax: the BERT family of language models in JAX / Flax."""
