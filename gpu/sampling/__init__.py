"""Sampling: the per-step metadata the runner builds and the counter-based random numbers that
make a seeded request reproducible whatever else is in the batch."""

from gpu.sampling.metadata import SamplingMetadata
from gpu.sampling.rng import gumbel_noise, uniform_from_counter

__all__ = ["SamplingMetadata", "gumbel_noise", "uniform_from_counter"]
