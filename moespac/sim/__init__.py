"""Simulator: hardware profiles, cost model, discrete-event trace replay, bounds and calibration.

Every number it produces is labelled `timing: simulated`.
"""
