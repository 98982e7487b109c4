"""Launchers: Cloud TPU VMs and pod slices (`python -m tpu.launch`), SLURM GPU clusters
(`python -m tpu.slurm`). The sweeps of experiments/ go through both (`python -m
experiments.launch`)."""
