"""Baseline scheduling policies, one module each, all implementing moespac.policy.Policy."""
