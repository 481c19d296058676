"""moespac: reproduce and benchmark MoE-SpAc (speculative decoding as a lookahead sensor for MoE offloading)."""

__version__ = "0.1.0"
