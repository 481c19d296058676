"""Experiment drivers: studies of their own that are not a table cell (the scheduler's overhead, the routing-locality
what-if, a proxy pair's statistics). Each runs the engine or the simulator below it and returns a record."""
