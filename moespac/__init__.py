"""moespac: reproduce and benchmark MoE-SpAc (speculative decoding as a lookahead sensor for MoE offloading)."""

from moespac import pinning

pinning.pin()  # before anything imports torch or numpy: they read their instruction-set switches once

__version__ = "0.1.0"
