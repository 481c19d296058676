"""The real engine: hybrid device/host expert execution, expert store, speculative decoding."""
