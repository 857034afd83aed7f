"""A run's health: what goes wrong while it trains, found and acted on. Non-finite values and loss
spikes (guard.py) and the rollback that follows (rollback.py), hangs (watchdog.py), slow ranks
(straggler.py), bad nodes before the first step (preflight.py), and the faults the tests inject
(faults.py). Stop requests (signals) are not health: they stay at train/stop.py, which the task
imports before anything heavy."""
