"""A run's life: launch with its preflight, tracking and notify hooks, following, recovery and its
decisions, any_of placement and moving, stop/start, attach, up and down. The layer above jobs, health,
checkpoints, notify, tracking and runlog: none of them imports it."""
